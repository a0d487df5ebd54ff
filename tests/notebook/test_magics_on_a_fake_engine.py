"""The magics in a real IPython shell over a fake engine: no hub, no worker.

``FakeEngine`` implements the ``Engine`` protocol (remote_magic/engine.py), the seam below the notebook: it
records every ``JobRequest`` the magics make and answers with results the test prepared. So what
``%%offload`` makes of its options, what it says, and how a result lands in the namespace are checked here
in milliseconds; that a real worker runs the same requests is tests/notebook/test_magics.py's.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Callable, Iterator, Sequence

import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell

from remote_magic.engine import Engine
from remote_magic.errors import NoSuchWorker, RemoteError, RequirementError
from remote_magic.job_request import CellSubmit, JobRequest, MapRequest
from remote_magic.results import FileChanges, JobResult
from remote_magic.wire import module_state
from remote_magic.wire.handles import RemoteValue
from remote_magic.wire.module_state import NAME as MODULE_STATE
from support import run

Answer = JobResult | BaseException | Callable[[JobRequest], JobResult]
"""What the fake engine answers a request with: a result, an error it raises, or a function of the request."""


class FakeEngine(Engine):
    """An engine that runs nothing: it keeps each request (``requests``) and the SUBMIT every engine would make
    of it (``submits``), and answers it with the next prepared answer (an empty result when none is left)."""

    def __init__(self, workers: Sequence[dict[str, Any]] = ({"name": "box", "state": "idle"},)) -> None:
        self.address = "fake://engine"
        self.version_notes: list[str] = []
        self.hub_cache: dict[str, int] = {}
        self.requests: list[JobRequest] = []
        self.submits: list[CellSubmit] = []
        self.answers: deque[Answer] = deque()
        self.listed = [dict(worker) for worker in workers]
        self.closed = False

    def answer(self, *answers: Answer) -> None:
        self.answers.extend(answers)

    def run_job(self, request: JobRequest) -> JobResult:
        # What every engine sends, made as the job goes: a malformed requirement fails here, before anything is sent.
        self.submits.append(request.submit())
        self.requests.append(request)
        answer = self.answers.popleft() if self.answers else JobResult({}, worker=request.worker or "box")
        if isinstance(answer, BaseException):
            raise answer
        return answer(request) if callable(answer) else answer

    def run_each(self, requests: Sequence[JobRequest]) -> list[Callable[[], JobResult]]:
        if not requests:
            raise NoSuchWorker("no workers to run on")
        results = []
        for request in requests:
            try:
                value = self.run_job(request)
            except BaseException as error:  # read by its caller, as a real engine's
                results.append(_raises(error))
            else:
                results.append(lambda value=value: value)
        return results

    def run_map(self, request: MapRequest) -> list[Any]:
        return [request.fn(item) for item in request.items]

    def workers(self, timeout: float = 10.0) -> list[dict[str, Any]]:
        return self.listed

    def close(self) -> None:
        self.closed = True


def _raises(error: BaseException) -> Callable[[], JobResult]:
    def read() -> JobResult:
        raise error

    return read


@pytest.fixture
def shell() -> Iterator[InteractiveShell]:
    """The real IPython shell with the extension loaded, and no connection."""
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "remote_magic")
    try:
        yield ip
    finally:
        ip.run_line_magic("unload_ext", "remote_magic")
        ip.reset(new_session=False)
        ip.config.pop("OffloadMagics", None)  # %config lasts as long as the shell, which every test shares


@pytest.fixture
def engine(shell: InteractiveShell) -> FakeEngine:
    """The fake engine, as the connection every group of magics shares."""
    fake = FakeEngine()
    shell.magics_manager.registry["CellMagics"].connection.client = fake
    return fake


# -- options become the request -----------------------------------------------------------------------


def test_a_plain_cell_sends_its_code_and_only_the_values_it_reads(shell: InteractiveShell, engine: FakeEngine) -> None:
    shell.user_ns.update(a=[1, 2], unused=object())
    result, _ = run(shell, "%%offload\nb = a + [3]")
    assert result.success, result.error_in_exec
    [request] = engine.requests
    assert request.code == "b = a + [3]\n"  # the cell as IPython hands it to the magic
    assert dict(request.inputs) == {"a": [1, 2]} and request.inputs["a"] is shell.user_ns["a"]
    assert (request.worker, request.timeout, request.gpu, request.gpu_kernels, request.retries) == (None, None, None,
                                                                                                None, 0)
    assert (request.require, request.prefer, request.keep, request.outputs) == (None, None, (), None)
    assert request.update_inputs and request.figure_formats == ("png",)
    assert request.module_state is not None and "os.environ" in request.module_state  # the cell takes ours
    assert request.text_format is not None and "pprint" in request.text_format


def test_every_option_of_a_cell_on_one_worker_reaches_its_request(shell: InteractiveShell, engine: FakeEngine) -> None:
    result, _ = run(shell, '%%offload matmul,softmax --timeout 5 --worker box --retries 2 --require "memory>=16GB" '
                           "--require zone==lab --prefer fastest --keep a,b\na = 1\nb = 2")
    assert result.success, result.error_in_exec
    [request] = engine.requests
    assert request.gpu == ("matmul", "softmax") and request.timeout == 5.0 and request.worker == "box"
    assert request.retries == 2 and request.require == ("memory>=16GB", "zone==lab")  # the quotes typed go
    assert request.prefer == "fastest" and request.keep == ("a", "b")
    assert request.submit().header["require"] == ["memory>=16GB", "zone==lab"]

    run(shell, "%%offload --gpu\nc = 1")
    assert engine.requests[-1].gpu is True


def test_the_configured_default_timeout_applies_unless_the_cell_says_otherwise(shell: InteractiveShell,
                                                                              engine: FakeEngine) -> None:
    shell.run_line_magic("config", "OffloadMagics.default_timeout = 7")
    run(shell, "%%offload\nx = 1")
    run(shell, "%%offload --timeout 2\nx = 1")
    assert [request.timeout for request in engine.requests] == [7.0, 2.0]


def test_a_kernel_defined_once_is_compiled_then_sent_with_every_cell(shell: InteractiveShell,
                                                                     engine: FakeEngine) -> None:
    wgsl = "@compute @workgroup_size(64) fn main() {}"
    _, out = run(shell, f"%%offload_kernel twice\n{wgsl}")
    assert "kernel gpu.twice compiled" in out.stdout
    compile_request = engine.requests[0]
    assert compile_request.code == "pass" and compile_request.gpu is True
    assert dict(compile_request.gpu_kernels or {}) == {"twice": wgsl + "\n"}
    run(shell, "%%offload twice\ny = 1")
    assert dict(engine.requests[1].gpu_kernels or {}) == {"twice": wgsl + "\n"} and engine.requests[1].gpu == ("twice",)


@pytest.mark.parametrize(("line", "says"), [
    ("--all --worker box", "use one of them"),
    ("--all --workers a,b", "use one of them"),
    ("--retries -1", "--retries takes 0 or more"),
    ("--all --retries 1", "--retries runs a cell again on another worker"),
    ("--all --require gpu", "--require and --prefer pick one worker"),
    ("--gather y", "--gather concatenates the pieces of a --split"),
    ("--split x --worker box", "--split runs the cell on several workers"),
    ("--split nothing", "`nothing` is not defined in the notebook"),
    ("--split unread", "the cell doesn't read `unread`"),
    ("--all --keep y", "--keep leaves values on the one worker"),
    ("--workers ,", "--workers needs names"),
    ("--no-such-flag", "unrecognized arguments"),
], ids=lambda value: value if value.startswith("-") else "")
def test_a_contradiction_among_the_options_is_a_usage_error_and_nothing_is_sent(
        shell: InteractiveShell, engine: FakeEngine, line: str, says: str) -> None:
    shell.user_ns.update(x=[1, 2, 3], unread=[4])
    with pytest.raises(UsageError, match=says.replace("-", r"\-").replace("[", r"\[")):
        shell.run_cell_magic("offload", line, "y = x")
    assert engine.requests == []


def test_a_malformed_requirement_is_a_usage_error_before_anything_runs(shell: InteractiveShell,
                                                                       engine: FakeEngine) -> None:
    with pytest.raises(UsageError, match="memory>>16"):
        shell.run_cell_magic("offload", "--require memory>>16", "y = 1")
    assert engine.requests == []
    engine.answer(RequirementError("no worker could ever have that"))
    with pytest.raises(UsageError, match="no worker could ever have that"):
        shell.run_cell_magic("offload", "", "y = 1")


def test_without_a_connection_a_cell_says_how_to_connect(shell: InteractiveShell) -> None:
    with pytest.raises(UsageError, match="not connected: run %offload_connect TOKEN first"):
        shell.run_cell_magic("offload", "", "y = 1")


# -- the result lands in the namespace ---------------------------------------------------------------


def test_what_the_cell_assigned_and_deleted_lands_and_its_value_is_the_cells(shell: InteractiveShell,
                                                                            engine: FakeEngine) -> None:
    shell.user_ns.update(gone=1, kept=2)
    engine.answer(JobResult({"c": 3, "kept": 20}, worker="box", deleted=["gone"], has_value=True, value=42))
    result, _ = run(shell, "%%offload\nc = 3\nkept = 20\ndel gone\n42")
    assert result.success, result.error_in_exec
    assert result.result == 42
    assert shell.user_ns["c"] == 3 and shell.user_ns["kept"] == 20 and "gone" not in shell.user_ns


def test_the_cell_takes_the_notebooks_random_state_and_the_notebook_takes_what_the_cell_left(
        shell: InteractiveShell, engine: FakeEngine) -> None:
    import random

    random.seed(9)
    left_by_the_cell = module_state.capture()["random"]
    after_the_cell = random.random()
    random.seed(5)
    here: list[Any] = []

    def seeding(request: JobRequest) -> JobResult:
        here.append(module_state.capture()["random"])  # the notebook's, as the cell is sent
        return JobResult({}, worker="box", module_state={"random": left_by_the_cell})

    engine.answer(seeding)
    run(shell, "%%offload\nimport random\nrandom.seed(9)")
    assert engine.submits[0].values[MODULE_STATE]["random"] == here[0] != left_by_the_cell
    assert random.random() == after_the_cell


def test_output_streamed_by_the_engine_appears_in_the_cell(shell: InteractiveShell, engine: FakeEngine) -> None:
    def printing(request: JobRequest) -> JobResult:
        request.on_stream({"name": "stdout", "text": "from the worker\n"})
        request.on_stream({"name": "stderr", "text": "a warning\n"})
        return JobResult({}, worker="box")

    engine.answer(printing)
    _, out = run(shell, "%%offload\nprint('from the worker')")
    assert out.stdout == "from the worker\n" and "a warning\n" in out.stderr


def test_an_object_changed_in_place_that_came_back_new_says_which_names_still_hold_the_old(
        shell: InteractiveShell, engine: FakeEngine) -> None:
    old = [1, 2]
    shell.user_ns.update(x=old, alias=old)
    engine.answer(JobResult({"x": [1, 2, 3]}, worker="box", in_place=["x"]))
    _, out = run(shell, "%%offload\nx.append(3)")
    assert shell.user_ns["x"] == [1, 2, 3] and shell.user_ns["alias"] is old
    assert ("remote-magic: `x` was changed in place on the worker and came back as a new object (a list can't be "
            "updated in place here): `alias`, which shared it here, still hold the old value") in out.stderr


def test_values_kept_on_the_worker_land_as_handles_and_say_so(shell: InteractiveShell, engine: FakeEngine) -> None:
    handle = RemoteValue("v1", "big", "numpy.ndarray", "--keep big", "box", "float64 (1000, 1000), 8.0 MB")
    engine.answer(JobResult({}, worker="box", kept_on_worker={"big": handle}))
    _, out = run(shell, "%%offload --keep big\nbig = make()")
    assert shell.user_ns["big"] is handle
    assert "stayed on worker 'box': the notebook holds a handle" in out.stderr
    run(shell, "%%offload\nsmall = big.sum()")  # a later cell reading it must run where it lives
    assert engine.requests[-1].worker == "box" and engine.requests[-1].inputs["big"] is handle


def test_files_the_cell_wrote_and_the_clients_notes_are_told(shell: InteractiveShell, engine: FakeEngine) -> None:
    def writing(request: JobRequest) -> JobResult:
        assert request.on_files is not None
        request.on_files(FileChanges("/srv/work", {"out.csv": 10}, ["old.csv"], 1, 1, worker="box"))
        return JobResult({}, worker="box", notes=["`v` went to the worker as a copy"])

    engine.answer(writing)
    _, out = run(shell, "%%offload\nwrite()")
    assert ("remote-magic: files written on worker 'box' while the cell ran: out.csv; deleted: old.csv — they are "
            "there, not here: %offload_get out.csv copies one here") in out.stderr
    assert "remote-magic: `v` went to the worker as a copy" in out.stderr


def test_stats_are_told_after_the_cell(shell: InteractiveShell, engine: FakeEngine) -> None:
    engine.answer(JobResult({}, worker="box", stats={"kernels": {"matmul": 2}, "gpu_time_s": 0.0015}))
    _, out = run(shell, "%%offload --stats\nx = 1")
    assert "remote-magic: ran on box: GPU kernels matmul×2; with numpy none; GPU time 1.50 ms" in out.stderr


def test_a_remote_exception_keeps_what_the_cell_did_before_it_and_raises(shell: InteractiveShell,
                                                                        engine: FakeEngine) -> None:
    error = RemoteError("ValueError", "boom on the worker")
    error.partial = JobResult({"done": 1}, worker="box")
    engine.answer(error)
    result, _ = run(shell, "%%offload\ndone = 1\nraise ValueError('boom on the worker')")
    assert result.error_in_exec is error
    assert shell.user_ns["done"] == 1


def test_a_module_missing_on_the_worker_names_the_worker_and_the_install(shell: InteractiveShell,
                                                                        engine: FakeEngine) -> None:
    error = RemoteError("ModuleNotFoundError", "No module named 'sklearn'")
    error.partial = JobResult({}, worker="box")
    engine.answer(error)
    _, out = run(shell, "%%offload\nimport sklearn")
    assert "`sklearn` is not installed on worker 'box'" in out.stderr


def test_sys_exit_on_the_worker_exits_the_cell_as_locally(shell: InteractiveShell, engine: FakeEngine) -> None:
    engine.answer(RemoteError("SystemExit", "3"))
    with pytest.raises(SystemExit) as exited:
        shell.run_cell_magic("offload", "", "import sys\nsys.exit(3)")
    assert exited.value.code == 3


# -- on several workers ------------------------------------------------------------------------------


def test_all_runs_one_request_per_worker_and_each_name_comes_back_by_worker(shell: InteractiveShell) -> None:
    engine = FakeEngine([{"name": "a", "state": "idle"}, {"name": "b", "state": "idle"}])
    shell.magics_manager.registry["CellMagics"].connection.client = engine

    def answer(request: JobRequest) -> JobResult:
        request.on_stream({"name": "stdout", "text": f"hello from {request.worker}\n"})
        return JobResult({"r": f"on {request.worker}"}, worker=str(request.worker), has_value=True, value=1)

    engine.answer(answer, answer)
    shell.user_ns["x"] = [1]
    result, out = run(shell, "%%offload --all\nr = x")
    assert result.success, result.error_in_exec
    assert [r.worker for r in engine.requests] == ["a", "b"]
    assert all(not r.update_inputs and dict(r.inputs) == {"x": [1]} for r in engine.requests)
    assert shell.user_ns["r"] == {"a": "on a", "b": "on b"} and result.result == {"a": 1, "b": 1}
    assert "[stdout:a]" in out.stdout and "hello from a" in out.stdout and "hello from b" in out.stdout


def test_split_cuts_the_input_by_worker_speed_and_gather_puts_the_pieces_back_in_order(
        shell: InteractiveShell) -> None:
    engine = FakeEngine([{"name": "slow", "state": "idle", "speed": 1.0},
                         {"name": "fast", "state": "idle", "speed": 3.0}])
    shell.magics_manager.registry["CellMagics"].connection.client = engine

    def doubled(request: JobRequest) -> JobResult:
        piece = request.inputs["x"]
        return JobResult({"y": [2 * v for v in piece], "n": len(piece)}, worker=str(request.worker))

    engine.answer(doubled, doubled)
    shell.user_ns.update(x=list(range(8)), factor=2)
    result, _ = run(shell, "%%offload --split x --gather y\ny = [factor * v for v in x]\nn = len(x)")
    assert result.success, result.error_in_exec
    pieces = {r.worker: r.inputs["x"] for r in engine.requests}
    assert pieces == {"slow": [0, 1], "fast": [2, 3, 4, 5, 6, 7]}  # 1 : 3
    assert all(r.inputs["factor"] == 2 for r in engine.requests)  # the other inputs go whole
    assert shell.user_ns["y"] == [0, 2, 4, 6, 8, 10, 12, 14] and shell.user_ns["n"] == {"slow": 2, "fast": 6}


def test_one_worker_failing_on_several_keeps_what_the_others_did_and_says_which(shell: InteractiveShell) -> None:
    engine = FakeEngine([{"name": "a", "state": "idle"}, {"name": "b", "state": "idle"}])
    shell.magics_manager.registry["CellMagics"].connection.client = engine
    engine.answer(JobResult({"r": 1}, worker="a"), RemoteError("ZeroDivisionError", "division by zero"))
    result, _ = run(shell, "%%offload --all\nr = 1 / n")
    assert result.error_in_exec is not None and "b" in str(result.error_in_exec)
    assert "ZeroDivisionError" in str(result.error_in_exec)
    assert shell.user_ns["r"] == {"a": 1}


def test_a_cell_reading_a_handle_cannot_run_on_several_workers(shell: InteractiveShell, engine: FakeEngine) -> None:
    shell.user_ns["big"] = RemoteValue("v1", "big", "numpy.ndarray", "--keep big", "box")
    with pytest.raises(UsageError, match="values that live on one worker"):
        shell.run_cell_magic("offload", "--all", "s = big.sum()")
    assert engine.requests == []


def test_unloading_the_extension_closes_the_engine(shell: InteractiveShell, engine: FakeEngine) -> None:
    shell.run_line_magic("unload_ext", "remote_magic")
    assert engine.closed
    shell.run_line_magic("load_ext", "remote_magic")  # for the fixture's own unload
