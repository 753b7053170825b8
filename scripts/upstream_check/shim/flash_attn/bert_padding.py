"""Test-only shim: re-exports flash_attn_cute.bert_padding."""
from flash_attn_cute.bert_padding import index_first_axis, index_put_first_axis, pad_input, unpad_input  # noqa: F401
