"""The layering of docs/architecture.md, checked on the source: imports point one way."""

import ast
import runpy
import subprocess
import sys
import warnings

import pytest

from tests.helpers.cli import REPO

PACKAGE = REPO / "fairseq_alibi"
TOOLS = ("fairseq_alibi.cli", "fairseq_alibi.preprocess")
#: the ``python -m fairseq_alibi.<tool>`` aliases kept for the commands users already run
#: (earlier docs and error messages spelled these five so); a new tool gets no alias
ALIASES = ("quickstart", "sweep", "corpus", "convert", "checkpoints")
#: the files the layering checks exempt, by exact path: the entry points of the tools
ENTRY_POINTS = frozenset(["__main__.py"] + [f"{alias}.py" for alias in ALIASES])
#: what each layer of the library may import of the package (docs/architecture.md's layers)
MATH = ("fairseq_alibi.alibi", "fairseq_alibi.cross_alibi")
ATTENTION = MATH + ("fairseq_alibi.modules.attention", "fairseq_alibi.error_hints")
OPTIONS = ATTENTION + ("fairseq_alibi.options", "fairseq_alibi.config_access")
LAYERS = {
    "fairseq_alibi/alibi.py": (),  # the math imports nothing of the package
    "fairseq_alibi/cross_alibi.py": (),
    "fairseq_alibi/config_access.py": (),
    "fairseq_alibi/error_hints.py": (),  # the one-line refusals: below every layer that refuses
    "fairseq_alibi/files.py": (),
    "fairseq_alibi/modules/attention": ATTENTION,
    "fairseq_alibi/options.py": OPTIONS,
    "fairseq_alibi/modules": OPTIONS + ("fairseq_alibi.modules",),
}
#: what the models may not import: the tools and the criteria (which build on the models)
MODELS_MAY_NOT = ("fairseq_alibi.criterions",) + TOOLS
TESTS = REPO / "tests"
#: the folders of tests/, by layer of the code (each folder's ``__init__.py`` says what it holds)
TEST_FOLDERS = ("architecture", "math", "attention", "options", "models", "translation",
                "checkpoints", "cli", "pipelines", "experiments", "benchmarks", "cuda")


def imported_modules(path, root=REPO):
    """Every module ``path`` imports, as absolute names (relative imports resolved against its
    place under ``root``)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = path.relative_to(root).with_suffix("").parts[:-1]
    if path.name == "__init__.py":
        package = path.relative_to(root).parts[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module
            if node.level:
                parent = package[: len(package) - node.level + 1]
                base = ".".join(parent + ((node.module,) if node.module else ()))
            if base:
                yield base
                yield from (f"{base}.{alias.name}" for alias in node.names)


def test_relative_imports_are_read_as_absolute_ones():
    found = set(imported_modules(PACKAGE / "modules" / "attention" / "__init__.py"))
    assert "fairseq_alibi.modules.attention.dispatch" in found


def test_no_model_module_imports_another():
    """Each model family is one file; what they share is in modules/stacks.py and
    models/architectures_and_limits.py, never in another model's file."""
    families = sorted(p.stem for p in (PACKAGE / "models").glob("alibi_*.py"))
    for family in families:
        others = {f"fairseq_alibi.models.{other}" for other in families if other != family}
        imported = set(imported_modules(PACKAGE / "models" / f"{family}.py"))
        assert not any(name.startswith(tuple(others)) for name in imported), family


def test_every_alias_module_is_a_tool_of_the_one_table():
    """``python -m fairseq_alibi.<tool>`` modules hold no table of their own: each is the same
    two lines, resolved through TOOLS by its name."""
    from fairseq_alibi.__main__ import TOOLS

    aliases = {str(path.relative_to(PACKAGE)) for path in PACKAGE.rglob("*.py")
               if "run_alias" in path.read_text()} - {"__main__.py"}
    assert aliases == {f"{alias}.py" for alias in ALIASES}
    assert {alias.replace("_", "-") for alias in ALIASES} <= set(TOOLS)
    for alias in ALIASES:
        code = [line for line in (PACKAGE / f"{alias}.py").read_text().splitlines()
                if line.strip() and not line.startswith('"""')]
        assert code == ["from fairseq_alibi.__main__ import run_alias",
                        "run_alias(__name__, __spec__)"], alias


def test_every_tool_module_is_in_the_one_table_or_said_shared():
    """cli/__init__.py lists no tools (``TOOLS`` does); it names what the tools share, and each
    module of cli/ is one or the other."""
    import fairseq_alibi.cli
    from fairseq_alibi.__main__ import TOOLS

    tools = {module for module, _, _ in TOOLS.values()}
    assert all(module.startswith("fairseq_alibi.cli.") for module in tools)
    shared = {f"fairseq_alibi.cli.{path.stem}" for path in (PACKAGE / "cli").glob("*.py")
              if path.name != "__init__.py"} - tools
    said = fairseq_alibi.cli.__doc__
    assert not [module for module in shared if f"~{module}`" not in said], said
    assert not [module for module in tools if f"~{module}`" in said]  # TOOLS is the one list
    assert {(PACKAGE / "cli" / f"{m.rsplit('.', 1)[1]}.py").is_file() for m in tools} == {True}


def test_no_two_library_files_share_a_name():
    """A file's name says what it holds: no ``common.py``, and no two files of the package with
    the same name, apart from a ``python -m`` alias and the tool it runs."""
    paths = [p.relative_to(PACKAGE) for p in PACKAGE.rglob("*.py") if p.name != "__init__.py"]
    assert not [p for p in paths if p.name == "common.py"]
    by_name = {}
    for path in paths:
        if str(path) not in ENTRY_POINTS:
            by_name.setdefault(path.name, []).append(str(path))
    assert {name: found for name, found in by_name.items() if len(found) > 1} == {}


def library_files():
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE)
        if relative.parts[0] in ("cli", "preprocess", "config"):
            continue
        if str(relative) in ENTRY_POINTS:
            continue  # exempt by exact path, so a library module named like a tool is checked
        yield path


def test_the_library_never_imports_a_tool():
    offenders = [
        f"{path.relative_to(REPO)} imports {name}"
        for path in library_files()
        for name in imported_modules(path)
        if name.startswith(TOOLS)
    ]
    assert not offenders, offenders


@pytest.mark.parametrize("layer", sorted(LAYERS))
def test_each_layer_imports_only_the_layers_above_it(layer):
    root = REPO / layer
    files = [root] if root.is_file() else sorted(root.rglob("*.py"))
    offenders = [
        f"{path.relative_to(REPO)} imports {name}"
        for path in files
        for name in imported_modules(path)
        if name.startswith("fairseq_alibi") and name != "fairseq_alibi"
        and not name.startswith(LAYERS[layer])
    ]
    assert not offenders, offenders


def test_the_models_import_no_tool_and_no_criterion():
    offenders = [
        f"{path.relative_to(REPO)} imports {name}"
        for path in sorted((PACKAGE / "models").rglob("*.py"))
        for name in imported_modules(path) if name.startswith(MODELS_MAY_NOT)
    ]
    assert not offenders, offenders


def is_a_test_module(name):
    """``tests.<folder>.test_x`` (or ``test_x``, imported with its folder on sys.path), or a name
    inside one."""
    parts = name.split(".")
    return parts[0].startswith("test_") or (
        parts[0] == "tests" and any(part.startswith("test_") for part in parts[1:3]))


def test_no_test_module_imports_another():
    """Tests share code through tests/helpers/ (fixtures: conftest.py) only: a test module
    imported by another ties the two files together (one cannot change or move without the
    other), and the importer runs the imported file's module-level setup."""
    offenders = [
        f"{path.relative_to(REPO)} imports {name}"
        for path in sorted(TESTS.rglob("*.py"))
        for name in imported_modules(path) if is_a_test_module(name)
    ]
    assert not offenders, offenders


def test_every_test_file_lives_in_a_layer_folder():
    """tests/<folder>/test_*.py, one level deep, in a folder of TEST_FOLDERS. Each folder is a
    package (its ``__init__.py``): pytest then imports ``tests.<folder>.test_x``, so two folders
    may hold files of the same name, and no folder goes on sys.path (``tests/math`` there would
    hide the standard library's ``math``)."""
    misplaced = [str(path.relative_to(REPO)) for path in sorted(TESTS.rglob("test_*.py"))
                 if path.parent.parent != TESTS or path.parent.name not in TEST_FOLDERS]
    assert not misplaced, misplaced
    assert [f for f in TEST_FOLDERS if not (TESTS / f / "__init__.py").is_file()] == []


def skips_without_cuda(path):
    """Whether the module as a whole is skipped without a GPU (``pytestmark`` names
    ``torch.cuda.is_available()``)."""
    return any(
        isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "pytestmark"
                                             for t in node.targets)
        and "cuda.is_available" in ast.unparse(node.value)
        for node in ast.parse(path.read_text()).body)


def test_cuda_tests_are_apart():
    """The tests that need a GPU are tests/cuda (which benchmarks/gpu.py runs on the device);
    every one of its files skips as a whole on a machine without one."""
    files = sorted(TESTS.rglob("test_*.py"))
    outside = [str(p.relative_to(REPO)) for p in files
               if skips_without_cuda(p) and p.parent.name != "cuda"]
    inside = [p for p in files if p.parent.name == "cuda"]
    assert inside and not outside, outside
    assert all(skips_without_cuda(p) for p in inside), inside


@pytest.mark.parametrize("source,imports_a_test_module", [
    ("from tests.math.test_x import y", True),
    ("import tests.math.test_x", True),
    ("from tests.math import test_x", True),
    ("from tests.test_x import y", True),
    ("from .test_x import y", True),
    ("from . import test_x", True),
    ("from ..cli.test_x import y", True),
    ("from ..cli import test_x", True),
    ("import test_x", True),
    ("from tests.helpers.cli import REPO", False),
    ("from tests.helpers import cli", False),
    ("from ..helpers.cli import REPO", False),
    ("from . import helpers", False),
])
def test_the_test_import_check_reads_every_form(source, imports_a_test_module, tmp_path):
    (tmp_path / "tests" / "math").mkdir(parents=True)
    probe = tmp_path / "tests" / "math" / "test_probe.py"
    probe.write_text(source + "\n")
    found = imported_modules(probe, root=tmp_path)
    assert any(is_a_test_module(name) for name in found) == imports_a_test_module


def test_no_script_edits_sys_path():
    found = [
        str(path.relative_to(REPO))
        for folder in ("fairseq_alibi", "benchmarks", "experiments", "tests", "examples")
        for path in (REPO / folder).rglob("*.py")
        if "sys.path.insert" in path.read_text() and path.name != "test_layout.py"
    ]
    assert not found, found


@pytest.mark.parametrize("tool", ALIASES)
def test_documented_tool_aliases_answer_help_in_process(tool, capsys, monkeypatch):
    """What ``python -m fairseq_alibi.<tool> --help`` executes (the alias module as
    ``__main__``), in this process; the real subprocess is the slow test below."""
    monkeypatch.setattr(sys, "argv", [f"fairseq_alibi.{tool}", "--help"])
    with warnings.catch_warnings():  # runpy warns when the alias was imported before
        warnings.simplefilter("ignore", RuntimeWarning)
        with pytest.raises(SystemExit) as exited:
            runpy.run_module(f"fairseq_alibi.{tool}", run_name="__main__", alter_sys=True)
    assert exited.value.code in (0, None)
    assert "usage" in capsys.readouterr().out.lower() or tool == "corpus"


@pytest.mark.slow
@pytest.mark.parametrize("tool", ALIASES)
def test_documented_tool_aliases_run(tool):
    out = subprocess.run([sys.executable, "-m", f"fairseq_alibi.{tool}", "--help"],
                         capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "usage" in out.stdout.lower() or tool == "corpus"


def test_importing_the_package_does_not_import_transformers():
    """transformers is an optional extra, imported by export-hf/import-hf only."""
    code = ("import sys, fairseq_alibi, fairseq_alibi.cli.hf_export_import, "
            "fairseq_alibi.__main__; print(sorted(m for m in "
            "('transformers', 'tokenizers', 'safetensors') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_without_fairseq_the_package_answers_where_it_is_and_says_what_to_install():
    """torch and fairseq are the user's to install: without them --user-dir and --version
    answer, a tool and the package's API are one line naming the install, not a traceback."""
    code = ("import sys, runpy; sys.modules['fairseq'] = None\n"
            "for argv in (['--user-dir'], ['--version'], ['windows', 'a', 'b']):\n"
            "    sys.argv = ['fairseq-alibi', *argv]\n"
            "    try:\n"
            "        runpy.run_module('fairseq_alibi', run_name='__main__')\n"
            "    except SystemExit as e:\n"
            "        print(e.code)\n"
            "try:\n"
            "    from fairseq_alibi import alibi_bias\n"
            "except ImportError as e:\n"
            "    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                         timeout=120)
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr[-2000:]
    lines = out.stdout.strip().splitlines()
    assert lines[:4] == [str(PACKAGE), "0", __import__("fairseq_alibi").__version__, "0"], lines
    assert lines[4].startswith("fairseq-alibi windows: error: fairseq is not installed")
    assert "pip install 'fairseq-alibi[fairseq]'" in lines[4]
    assert lines[5].startswith("fairseq is not installed") and len(lines) == 6


def test_the_converters_import_one_another_one_way():
    """convert and forks share cli/checkpoint_io.py, which imports neither (no import circle)."""
    shared = PACKAGE / "cli" / "checkpoint_io.py"
    assert not [n for n in imported_modules(shared) if n.startswith(TOOLS)]
    forks = PACKAGE / "cli" / "forks.py"
    convert = "fairseq_alibi.cli.convert_checkpoints"
    assert not [n for n in imported_modules(forks) if n.startswith(convert)]
    hf = PACKAGE / "cli" / "hf_export_import.py"
    assert not [n for n in imported_modules(hf)
                if n.startswith((convert, "fairseq_alibi.cli.forks"))]


@pytest.mark.parametrize("tool", ["export-hf", "import-hf", "convert", "checkpoints"])
def test_one_command_dispatches_every_tool(tool, capsys):
    from fairseq_alibi.__main__ import main

    with pytest.raises(SystemExit) as exited:
        main([tool, "--help"])
    assert exited.value.code == 0
    assert "usage" in capsys.readouterr().out.lower()
