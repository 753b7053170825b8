"""flash-attn 2.6+'s flash_attn.bert_padding: moving between padded (batch, seqlen, ...) tensors with
an attention mask and the packed (total, ...) rows, cu_seqlens and max_seqlen that the varlen
functions take. Differentiable; pure torch."""
import torch
import torch.nn.functional as F


class _IndexFirstAxis(torch.autograd.Function):
    """x[indices] along the first axis; the backward scatters the gradient back (0 elsewhere)."""

    @staticmethod
    def forward(ctx, x, indices):
        ctx.save_for_backward(indices)
        ctx.first_axis_dim = x.size(0)
        return x[indices]

    @staticmethod
    def backward(ctx, grad_output):
        (indices,) = ctx.saved_tensors
        grad = grad_output.new_zeros((ctx.first_axis_dim, *grad_output.shape[1:]))
        grad[indices] = grad_output
        return grad, None


class _IndexPutFirstAxis(torch.autograd.Function):
    """A zero tensor of first_axis_dim rows with `values` at rows `indices`; the backward gathers."""

    @staticmethod
    def forward(ctx, values, indices, first_axis_dim):
        ctx.save_for_backward(indices)
        out = values.new_zeros((first_axis_dim, *values.shape[1:]))
        out[indices] = values
        return out

    @staticmethod
    def backward(ctx, grad_output):
        (indices,) = ctx.saved_tensors
        return grad_output[indices], None, None


def index_first_axis(x, indices):
    """x[indices] along the first axis (indices: int64 (n,)), differentiable."""
    return _IndexFirstAxis.apply(x, indices)


def index_put_first_axis(values, indices, first_axis_dim):
    """(first_axis_dim, ...) zeros with values (n, ...) at rows indices, differentiable."""
    return _IndexPutFirstAxis.apply(values, indices, first_axis_dim)


def unpad_input(hidden_states, attention_mask, unused_mask=None):
    """hidden_states (batch, seqlen, ...); attention_mask (batch, seqlen), bool or int, nonzero where
    a token is real; unused_mask (batch, seqlen), nonzero where a slot is allocated but unused (it is
    kept in the rows, counted in cu_seqlens, not in seqused).
    Returns (hidden_states (total, ...): the kept tokens in order; indices int64 (total,): their
    positions in the flattened (batch * seqlen) input; cu_seqlens int32 (batch + 1,); max_seqlen_in_batch
    (an int); seqused int32 (batch,): each sequence's real tokens)."""
    kept = attention_mask != 0
    if unused_mask is not None:
        kept = kept | (unused_mask != 0)
    seqlens = kept.sum(dim=-1, dtype=torch.int32)
    seqused = (attention_mask != 0).sum(dim=-1, dtype=torch.int32)
    indices = kept.flatten().nonzero().flatten()
    max_seqlen_in_batch = int(seqlens.max()) if seqlens.numel() else 0
    cu_seqlens = F.pad(seqlens.cumsum(0, dtype=torch.int32), (1, 0))
    return index_first_axis(hidden_states.flatten(0, 1), indices), indices, cu_seqlens, max_seqlen_in_batch, seqused


def pad_input(hidden_states, indices, batch, seqlen):
    """The inverse of unpad_input: hidden_states (total, ...) back to (batch, seqlen, ...), zeros where
    no row maps (indices as unpad_input returned them)."""
    return index_put_first_axis(hidden_states, indices, batch * seqlen).unflatten(0, (batch, seqlen))
