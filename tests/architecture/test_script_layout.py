"""The layout of ``experiments/`` and ``benchmarks/``: small, named pieces a newcomer can read.

- no import cycle among their modules;
- an experiment imports no other experiment, only the designated shared modules
  (:data:`SHARED_EXPERIMENT_MODULES`), the parts of its own command (``<name>_<part>.py``, e.g.
  ``encoder_study_report.py``) and the dispatches of :data:`DISPATCHES` (a command that hands
  its run to another command);
- a benchmark likewise, with :data:`SHARED_BENCHMARK_MODULES` (the parts of ``gpu``:
  ``gpu_supervisor``, ``gpu_parts``, ``gpu_report``, ``gpu_decode``);
- no file past :data:`MAX_LINES` lines, no function past :data:`MAX_FUNCTION_LINES` lines unless
  a ``# long: <reason>`` comment sits on its ``def`` line or the line above.
"""

import ast

import pytest

from tests.helpers.cli import REPO
FOLDERS = ("experiments", "benchmarks")
MAX_LINES = 800
MAX_FUNCTION_LINES = 80
#: what the experiments share: run helpers of the language-model and sequence-to-sequence
#: experiments, the translation-length grid's configurations and corpora, the flags check
SHARED_EXPERIMENT_MODULES = {"lm_runs", "seq2seq_runs", "translation_runs", "model_flags"}
#: what the benchmarks share: timing and peak memory, Markdown tables and the machine line,
#: fairseq subprocesses, building a fairseq Trainer, the cases more than one benchmark times,
#: packed rows of documents
SHARED_BENCHMARK_MODULES = {"timing", "tables", "subprocesses", "trainer", "cases", "packing"}
#: (command, command it hands its run to): ``translation_length --select`` runs the selection
#: of ``translation_selection``; ``slope_windows --family encoder`` and ``document_masks --family
#: mlm`` pretrain and score with the encoder study's own steps; ``benchmarks.run`` runs every
#: benchmark
DISPATCHES = {
    ("experiments.translation_length", "experiments.translation_selection"),
    ("experiments.slope_windows_encoder", "experiments.encoder_study"),
    ("experiments.slope_windows_encoder", "experiments.encoder_study_configs"),
    ("experiments.document_masks", "experiments.encoder_study"),
    ("experiments.document_masks", "experiments.encoder_study_configs"),
    *{("benchmarks.run", f"benchmarks.{name}")
      for name in ("attention", "decoding", "encoder", "eval_lm", "train", "translation")},
}


def modules(folder):
    return {f"{folder}.{path.stem}": path for path in sorted((REPO / folder).glob("*.py"))
            if path.stem != "__init__"}


ALL = {name: path for folder in FOLDERS for name, path in modules(folder).items()}


def imports_of(path, known):
    """The modules of ``known`` that ``path`` imports (at any depth: a lazy import counts)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        found |= {name for name in names if name in known}
    return found


def graph(known=ALL):
    return {name: imports_of(path, known) for name, path in known.items()}


def find_cycle(edges):
    """One cycle of ``edges`` (``{node: set of nodes}``) as a list of nodes, or ``None``."""
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = "done"
        return None

    for node in sorted(edges):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def command_of(module):
    """The command a module is a part of: the shortest module name of its folder that it is, or
    that it starts with followed by ``_`` (``benchmarks.gpu_report``: ``benchmarks.gpu``)."""
    folder, name = module.split(".")
    owners = [other for other in (m.split(".")[1] for m in ALL if m.startswith(folder + "."))
              if name == other or name.startswith(other + "_")]
    return f"{folder}.{min(owners, key=len)}" if owners else module


def allowed(importer, imported):
    folder, _ = importer.split(".")
    other_folder, other = imported.split(".")
    if folder != other_folder:  # an experiment may use the benchmarks' shared modules
        return folder == "experiments" and other in SHARED_BENCHMARK_MODULES
    shared = SHARED_EXPERIMENT_MODULES if folder == "experiments" else SHARED_BENCHMARK_MODULES
    return (other in shared or command_of(importer) == command_of(imported)
            or (importer, imported) in DISPATCHES)


def long_functions(path, root=REPO):
    """``name (lines)`` of each function past the limit without a ``# long:`` reason."""
    lines = path.read_text().splitlines()
    found = []
    for node in ast.walk(ast.parse("\n".join(lines))):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        length = node.end_lineno - node.lineno + 1
        nearby = lines[max(0, node.lineno - 2):node.lineno]
        if length > MAX_FUNCTION_LINES and not any("# long:" in line for line in nearby):
            found.append(f"{path.relative_to(root)}: {node.name} ({length} lines)")
    return found


def test_the_designated_modules_exist():
    named = {f"experiments.{m}" for m in SHARED_EXPERIMENT_MODULES}
    named |= {f"benchmarks.{m}" for m in SHARED_BENCHMARK_MODULES}
    named |= {module for pair in DISPATCHES for module in pair}
    assert named <= set(ALL), named - set(ALL)


def test_there_is_no_import_cycle():
    assert find_cycle(graph()) is None, " -> ".join(find_cycle(graph()))


def test_each_module_imports_only_shared_helpers_its_parts_and_dispatches():
    wrong = [f"{a} imports {b}" for a, targets in graph().items() for b in sorted(targets)
             if not allowed(a, b)]
    assert not wrong, wrong


@pytest.mark.parametrize("name", sorted(ALL))
def test_no_file_runs_past_the_limit(name):
    assert len(ALL[name].read_text().splitlines()) <= MAX_LINES


def test_no_function_runs_past_the_limit_without_a_reason():
    found = [entry for path in ALL.values() for entry in long_functions(path)]
    assert not found, found


def test_no_library_function_runs_past_the_limit_without_a_reason():
    """The same rule for the package (its files have no line limit of their own here)."""
    found = [entry for path in sorted((REPO / "fairseq_alibi").rglob("*.py"))
             for entry in long_functions(path)]
    assert not found, found


def test_the_checks_catch_what_they_are_for(tmp_path):
    """A cycle, a long function without a reason, and one with."""
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
    assert not allowed("experiments.pointer_trace", "experiments.translation_length")
    assert allowed("experiments.pointer_trace", "experiments.translation_runs")
    assert allowed("experiments.encoder_study", "experiments.encoder_study_report")
    assert not allowed("benchmarks.encoder", "benchmarks.attention")
    assert allowed("benchmarks.gpu_parts", "benchmarks.gpu_report")
    assert not allowed("experiments.translation_selection", "experiments.translation_length")
    body = "\n".join(["    x = 1"] * MAX_FUNCTION_LINES)
    probe = tmp_path / "probe.py"
    probe.write_text(f"def f():\n{body}\n\n\n# long: a table, one row a line\n"
                     f"def g():\n{body}\n")
    assert long_functions(probe, tmp_path) == [f"probe.py: f ({MAX_FUNCTION_LINES + 1} lines)"]
