"""The test suite itself (CPU only): no module defines a test twice. Python keeps a name's last
definition, so an earlier test of the same name would never run, and nothing would say so."""
import ast
import collections
import pathlib

TESTS = pathlib.Path(__file__).parent


def _redefined(source):
    """The test_* names that one module's top level (or one class's body) defines more than once."""
    scopes = [ast.parse(source)]
    scopes += [node for node in scopes[0].body if isinstance(node, ast.ClassDef)]
    repeated = []
    for scope in scopes:
        names = collections.Counter(node.name for node in scope.body
                                    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                                    and node.name.startswith("test_"))
        repeated += [name for name, count in names.items() if count > 1]
    return repeated


def test_redefinitions_are_found():
    assert _redefined("def test_a(): pass\ndef test_b(): pass\ndef test_a(x): pass\n") == ["test_a"]
    assert _redefined("class TestC:\n    def test_a(self): pass\n    def test_a(self): pass\n") == ["test_a"]
    assert _redefined("def test_a(): pass\nclass TestC:\n    def test_a(self): pass\n") == []


def test_no_test_is_defined_twice():
    modules = sorted(TESTS.glob("test_*.py"))
    assert len(modules) > 5, "the test modules are next to this one"
    repeated = {path.name: names for path in modules if (names := _redefined(path.read_text()))}
    assert not repeated, f"tests defined twice (the earlier definitions never run): {repeated}"
