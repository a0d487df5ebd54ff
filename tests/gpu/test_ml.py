"""tinygrad in offloaded cells: ``import tinygrad`` computes on the worker's GPU (its ``WEBGPU`` device is the
worker's wgpu device, ``worker/gpu/tinygrad_device.py``), a model's weights stay there between cells, and a
small model learns; through a real remote-worker on a real adapter (lavapipe without a GPU)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Iterator

import nbformat
import numpy as np
import pytest
from browser_tabs import batches_run, chromium, chromium_path, open_tab
from gpu_checks import rel_err
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output
from nbclient import NotebookClient

import remote_magic
from remote_magic.errors import RemoteMagicError
from remote_magic.wire.handles import RemoteValue
from support import WorkerProcess, cell_text, connected_shell, in_thread, require_a_gpu, start_worker, wait_for

pytestmark = pytest.mark.gpu

MODEL = """
from tinygrad import Tensor, nn, Context
from tinygrad.nn.optim import Adam

class MLP:
    def __init__(self):
        self.l1, self.l2 = nn.Linear(4, 16), nn.Linear(16, 1)
    def __call__(self, x):
        return self.l2(self.l1(x).relu())

Tensor.manual_seed(0)
model = MLP()
opt = Adam(nn.state.get_parameters(model), lr=0.05)
device = Tensor.zeros(1).device
"""

TRAIN = """
X, Y = Tensor(features), Tensor(targets)
losses = []
with Context(TRAINING=1):
    for _ in range(steps):
        opt.zero_grad()
        loss = ((model(X) - Y) ** 2).mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
predicted = model(X).numpy()
"""


@pytest.fixture(scope="module")
def ml_worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerProcess]:
    w = start_worker(tmp_path_factory.mktemp("ml-worker"), "--listen", "127.0.0.1:0", "--gpu", "on", "--name", "ml",
                     cwd=tmp_path_factory.mktemp("ml-cwd"))  # where the cells' files go
    require_a_gpu(w)
    yield w
    w.stop()


@pytest.fixture
def ip(ml_worker: WorkerProcess) -> Iterator[InteractiveShell]:
    with connected_shell(ml_worker.token) as (shell, _):
        yield shell


def _run(ip: InteractiveShell, cell: str) -> str:
    with capture_output() as out:
        result = ip.run_cell(cell)
    assert result.success, f"{result.error_in_exec}\n{out.stdout}\n{out.stderr}"
    return out.stdout


def test_a_model_trains_on_the_workers_gpu_and_its_weights_stay_there(ip: InteractiveShell) -> None:
    rng = np.random.default_rng(1)
    features = rng.standard_normal((64, 4)).astype(np.float32)
    targets = (features @ np.array([[1.0], [-2.0], [0.5], [3.0]], np.float32) + 0.25).astype(np.float32)
    ip.user_ns.update(features=features, targets=targets, steps=30)
    _run(ip, "%%offload\n" + MODEL)
    assert ip.user_ns["device"] == "WEBGPU"  # tinygrad's default device there, with nothing set in the cell
    model = ip.user_ns["model"]
    assert isinstance(model, RemoteValue) and "tinygrad Tensor on the worker's GPU" in model.why

    _run(ip, "%%offload\n" + TRAIN)
    first = ip.user_ns["losses"]
    _run(ip, "%%offload\n" + TRAIN)  # the same model, in place: it goes on learning where it stopped
    second = ip.user_ns["losses"]
    assert second[0] == pytest.approx(first[-1], rel=0.5)
    assert second[-1] < first[0] / 20, (first, second)
    predicted = ip.user_ns["predicted"]
    assert isinstance(predicted, np.ndarray) and predicted.shape == (64, 1) and predicted.dtype == np.float32
    assert float(np.mean((predicted - targets) ** 2)) == pytest.approx(second[-1], rel=0.5)

    _run(ip, "%%offload\n"  # its weights saved in the worker's folder, and loaded into a new model
             "nn.state.safe_save(nn.state.get_state_dict(model), 'mlp.safetensors')\n"
             "loaded = MLP()\nnn.state.load_state_dict(loaded, nn.state.safe_load('mlp.safetensors'))\n"
             "same = loaded(Tensor(features)).numpy()")
    np.testing.assert_array_equal(ip.user_ns["same"], predicted)


def test_a_new_executor_finds_the_programs_and_schedules_an_earlier_one_generated(
        ip: InteractiveShell, ml_worker: WorkerProcess) -> None:
    rng = np.random.default_rng(3)
    ip.user_ns.update(features=rng.standard_normal((64, 4), dtype=np.float32),
                      targets=rng.standard_normal((64, 1), dtype=np.float32), steps=3)
    count = ("from tinygrad.codegen import to_program_cache\nfrom tinygrad.schedule import schedule_cache\n"
             "programs, schedules = len(to_program_cache), len(schedule_cache)\n"
             "del to_program_cache, schedule_cache")  # (a schedule's buffers don't leave the worker)
    _run(ip, "%%offload\n" + MODEL + TRAIN + count)
    generated, scheduled, first_losses = ip.user_ns["programs"], ip.user_ns["schedules"], ip.user_ns["losses"]
    _run(ip, "%offload_reset")  # a new interpreter: a new executor process (the old one's tensors are gone)
    for name in [name for name, value in ip.user_ns.items() if isinstance(value, RemoteValue)]:
        del ip.user_ns[name]
    _run(ip, "%%offload\nfrom tinygrad import Device\nheld = len(Device['WEBGPU'].allocator.held)\n"
             "search_key = Device['WEBGPU'].renderer.suffix\n" + count)
    assert ip.user_ns["programs"] >= generated > 0  # loaded as the device opened, before any kernel ran
    assert ip.user_ns["schedules"] >= scheduled > 0
    assert ip.user_ns["held"] == 0  # (the schedules came without the buffers they were last run on)
    with remote_magic.connect(ml_worker.token) as client:
        [info] = client.workers()
    # tinygrad's kernel search (BEAM) keeps its results by this key: the adapter's, not one for every WEBGPU
    assert info["gpu"]["adapter"] in ip.user_ns["search_key"]
    _run(ip, "%%offload\n" + MODEL + TRAIN + count)
    # the same model: not one program generated anew, not one schedule made anew, and the same losses
    assert (ip.user_ns["programs"], ip.user_ns["schedules"]) == (generated, scheduled)
    assert ip.user_ns["losses"] == first_losses


def test_a_saved_schedule_leaves_the_buffers_it_ran_on_behind(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """tinygrad keeps one ``BUFFER`` placeholder per slot of a schedule, and one may stand for a realized buffer in
    the process that saves it (a jitted GPT-2 block's did: 9 MB of weights in the file): the file keeps the
    placeholder only. (In this process, on tinygrad's pure-Python device: no GPU, no compiler.)"""
    import gc

    from tinygrad import Tensor
    from tinygrad.schedule import schedule_cache
    from tinygrad.uop import Ops
    from tinygrad.uop.ops import UOp

    from remote_magic.worker.gpu.tinygrad_programs import ProgramCache

    monkeypatch.setenv("REMOTE_MAGIC_HOME", str(tmp_path))
    weights = np.arange(4096, dtype=np.float32) + 0.5
    held = Tensor(weights, device="PYTHON").realize()
    placeholder = held.uop.buf_uop
    assert placeholder.op is Ops.BUFFER and placeholder.realized is not None
    programs = ProgramCache("an adapter of this test", type("Renderer", (), {}))
    schedule_cache[b"this test's schedule"] = UOp(Ops.LINEAR, src=(placeholder,))
    schedule_cache[b"one that doesn't pickle"] = UOp(Ops.LINEAR, arg=lambda: None)  # (left out, not an error)
    try:
        programs.save()
        del schedule_cache[b"this test's schedule"], schedule_cache[b"one that doesn't pickle"], held, placeholder
        gc.collect()
        saved = programs.path.read_bytes()
        assert weights.tobytes()[:64] not in saved and len(saved) < weights.nbytes
        programs.load()
        (loaded,) = schedule_cache[b"this test's schedule"].src
        assert loaded.op is Ops.BUFFER and loaded.realized is None and loaded.dtype.itemsize == 4
        assert b"one that doesn't pickle" not in schedule_cache
    finally:
        schedule_cache.pop(b"this test's schedule", None)
        schedule_cache.pop(b"one that doesn't pickle", None)


def test_a_jitted_step_made_in_one_cell_runs_in_the_next(ip: InteractiveShell) -> None:
    rng = np.random.default_rng(4)
    ip.user_ns.update(features=rng.standard_normal((32, 4), dtype=np.float32),
                      targets=rng.standard_normal((32, 1), dtype=np.float32), steps=0)
    _run(ip, "%%offload\n" + MODEL + TRAIN + """
from tinygrad import TinyJit

@TinyJit
def step():
    opt.zero_grad()
    loss = ((model(X) - Y) ** 2).mean()
    loss.backward()
    opt.step()
    return loss.realize()

with Context(TRAINING=1):
    jitted = [step().item() for _ in range(4)]  # captured at the second call, replayed after
""")
    assert isinstance(ip.user_ns["step"], RemoteValue)  # it holds the model's tensors: it stays there
    _run(ip, "%%offload\nwith Context(TRAINING=1):\n    more = [step().item() for _ in range(4)]")
    jitted, more = ip.user_ns["jitted"], ip.user_ns["more"]
    assert all(later < earlier for earlier, later in zip(jitted + more, (jitted + more)[1:])), (jitted, more)


JITTED_WITH_NEW_INPUTS = """
from tinygrad import Device, Tensor, TinyJit, Variable
from tinygrad.engine.realize import graph_cache

@TinyJit
def combine(a, b):
    return (a * b + a.sum()).realize(), (a - b).relu().max(axis=1).realize()

@TinyJit
def prefix_sums(a):
    return (a * 2).sum(axis=1).realize(), (a + 1).max(axis=1).realize()

@TinyJit
def chain(a, b):  # its second kernel reads only the first's buffer: its bind group is made once
    rows = (a * b).sum(axis=1).contiguous()
    return (rows.exp() + rows.sum()).realize()

webgpu = Device["WEBGPU"]
webgpu.tuned_matmul, weight = "always", Tensor(w).realize()

@TinyJit
def tuned_chain(a, b):  # the tuned matmul, its prologue and epilogue reading no input: made once too
    return ((a * b).contiguous().relu() @ weight + 1).exp().realize()

combined = [[t.numpy() for t in combine(Tensor(x[i]), Tensor(y[i]))] for i in range(len(x))]
chained = [chain(Tensor(x[i]), Tensor(y[i])).numpy() for i in range(len(x))]
tuned_before = webgpu.tuned_matmuls
tuned_chained = [tuned_chain(Tensor(x[i]), Tensor(y[i])).numpy() for i in range(len(x))]
tuned_runs, webgpu.tuned_matmul = webgpu.tuned_matmuls - tuned_before, "measure"
dispatches = [d for g in graph_cache.values() for d in getattr(g, "dispatches", ())]
made_once = sum(d.bound is not None for d in dispatches)
tuned_made_once = [len(d.bound) for d in dispatches if any(b.tuned_matmul for b in d.bound or ())]
prefixes = []
for n in (3, 7, 5, 7, 2):
    bound = Variable("n", 1, x.shape[2]).bind(n)
    prefixes.append(tuple(t.numpy() for t in prefix_sums(Tensor(x[0])[:, :bound])))
graphs = sorted(type(g).__name__ for g in graph_cache.values())
held = Tensor(x[0]).realize(), Tensor(y[0]).realize()  # (a freed input's buffer would submit the work itself)
recording_after_a_replay, default = {}, Device["WEBGPU"].submits_each_batch
for submits_each_batch in (True, False):
    Device["WEBGPU"].submits_each_batch = submits_each_batch
    combine(*held)
    recording_after_a_replay[submits_each_batch] = Device["WEBGPU"].recording
    Device["WEBGPU"].synchronize()
Device["WEBGPU"].submits_each_batch = default
del held
"""


JITTED_OUTPUTS = ("combined", "chained", "made_once", "tuned_chained", "tuned_runs", "tuned_made_once", "prefixes",
                  "graphs", "recording_after_a_replay")


def _jitted_inputs() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(8)
    x, y = rng.standard_normal((5, 6, 9), dtype=np.float32), rng.standard_normal((5, 6, 9), dtype=np.float32)
    return {"x": x, "y": y, "w": rng.standard_normal((9, 4), dtype=np.float32) / 3}


def _check_jitted_replays(values: dict[str, Any], x: np.ndarray, y: np.ndarray, w: np.ndarray) -> None:
    """What :data:`JITTED_WITH_NEW_INPUTS` left, against numpy."""
    # new inputs every call: captured at the second, replayed from the third through the graph, each call's values
    for (product, top), a, b in zip(values["combined"], x, y):
        np.testing.assert_allclose(product, a * b + a.sum(), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(top, np.maximum(a - b, 0).max(axis=1), rtol=1e-6)
    for chained, a, b in zip(values["chained"], x, y):
        rows = (a.astype(np.float64) * b).sum(axis=1)
        np.testing.assert_allclose(chained, np.exp(rows) + rows.sum(), rtol=1e-5, atol=1e-5)
    assert values["made_once"] >= 1
    for tuned, a, b in zip(values["tuned_chained"], x, y):
        np.testing.assert_allclose(tuned, np.exp(np.maximum(a.astype(np.float64) * b, 0) @ w + 1), rtol=1e-5)
    # each call ran the tuned matmul once (the replays' counted by the graph), recorded with its prologue and
    # epilogue as made once
    assert values["tuned_runs"] == len(x)
    assert values["tuned_made_once"] == [3], values["tuned_made_once"]
    # a variable's value put in at each replay: the kernels' sizes follow it
    for (sums, top), n in zip(values["prefixes"], (3, 7, 5, 7, 2)):
        np.testing.assert_allclose(sums, (x[0][:, :n] * 2).sum(axis=1), rtol=1e-5)
        np.testing.assert_allclose(top, (x[0][:, :n] + 1).max(axis=1), rtol=1e-6)
    assert "WebGpuGraph" in values["graphs"], values["graphs"]
    # on a GPU, submitted as it returns: the GPU starts on it at once; on a software adapter, with the next read
    assert values["recording_after_a_replay"] == {True: False, False: True}


def test_a_jitted_function_replayed_through_the_graph_gives_each_calls_own_answer(ip: InteractiveShell) -> None:
    inputs = _jitted_inputs()
    ip.user_ns.update(inputs)
    _run(ip, "%%offload\n" + JITTED_WITH_NEW_INPUTS)
    _check_jitted_replays({name: ip.user_ns[name] for name in JITTED_OUTPUTS}, **inputs)


def test_one_adam_step_matches_numpy(ip: InteractiveShell) -> None:
    rng = np.random.default_rng(2)
    x, w, target = (rng.standard_normal(shape).astype(np.float32) for shape in ((8, 5), (5, 3), (8, 3)))
    ip.user_ns.update(x=x, w=w, target=target)
    _run(ip, "%%offload\n"
             "from tinygrad import Tensor, Context\nfrom tinygrad.nn.optim import Adam\n"
             "weight = Tensor(w)\nopt = Adam([weight], lr=0.1)\n"
             "with Context(TRAINING=1):\n"
             "    opt.zero_grad()\n    ((Tensor(x) @ weight - Tensor(target)) ** 2).mean().backward()\n    opt.step()\n"
             "stepped = weight.numpy()\ndel weight, opt")
    gradient = 2 * x.T @ (x @ w - target) / target.size
    m, v = 0.1 * gradient, 0.001 * gradient ** 2  # Adam's moments after one step (betas 0.9, 0.999)
    expected = w - 0.1 * (m / 0.1) / (np.sqrt(v / 0.001) + 1e-8)
    np.testing.assert_allclose(ip.user_ns["stepped"], expected, rtol=1e-5, atol=1e-6)


KERNEL_TIMES = """
from tinygrad import Tensor, Device
webgpu = Device['WEBGPU']
x = Tensor(a).contiguous().realize()
with webgpu.kernel_times() as times:
    sums = [(x * k).exp().sum(axis=0).numpy() for k in (1.0, 2.0, 3.0)]
    try:
        with webgpu.kernel_times():
            pass
    except Exception as exc:
        nested = str(exc)
timed, ran = dict(times.seconds), dict(times.dispatches)
after = (x + 1).sum().numpy()  # (untimed again, in the shared pass)
try:
    with webgpu.kernel_times():
        raise ValueError("the block failed")
except ValueError:
    pass
with webgpu.kernel_times() as again:  # (the failed block left the device untimed: this one times)
    (x * 5).sum().numpy()
    # a product compiled here is measured against the tuned matmul, which times by the clock while the cell times
    product = (Tensor(a[:40, :48]) @ Tensor(a[:48, :36])).numpy()
timed_again = sum(again.dispatches.values())
"""


def test_kernel_times_give_each_kernels_gpu_time_and_count(ip: InteractiveShell, ml_worker: WorkerProcess) -> None:
    a = np.random.default_rng(3).standard_normal((256, 64), dtype=np.float32)
    ip.user_ns["a"] = a
    _run(ip, "%%offload\n" + KERNEL_TIMES)
    for k, got in zip((1.0, 2.0, 3.0), ip.user_ns["sums"]):
        np.testing.assert_allclose(got, np.exp(a * k).sum(axis=0), rtol=1e-5)
    np.testing.assert_allclose(ip.user_ns["after"], (a + 1).sum(), rtol=1e-5)
    timed, ran = ip.user_ns["timed"], ip.user_ns["ran"]
    # the kernels of the three reductions (on lavapipe one program, run three times), each run timed
    assert ran and set(timed) == set(ran) and sum(ran.values()) % 3 == 0, ran
    assert all(seconds > 0 for seconds in timed.values()), timed
    assert "already timing" in ip.user_ns["nested"]
    assert ip.user_ns["timed_again"] >= 2
    np.testing.assert_allclose(ip.user_ns["product"], a[:40, :48] @ a[:48, :36], rtol=1e-5, atol=1e-5)
    assert "the tuned matmul failed" not in ml_worker.log()


TUNED_PRODUCTS = """
from tinygrad import Tensor, Device
webgpu = Device['WEBGPU']
webgpu.tuned_matmul = 'always'
A, B, At, Bt = Tensor(a), Tensor(b), Tensor(a.T.copy()), Tensor(b.T.copy())
made = {'x @ w': lambda: A @ B, 'x @ w.T': lambda: A @ Bt.T, 'g.T @ x': lambda: At.T @ B,
        'w.T @ x.T': lambda: At.T @ Bt.T, '(x @ w).T': lambda: (A @ B).T.contiguous(), 'x @ x.T': lambda: A @ A.T,
        'past the tiles': lambda: Tensor(c) @ Tensor(d), 'one row': lambda: Tensor(a[:1]) @ B,
        'K = 1': lambda: Tensor(a[:, :1]) @ Tensor(b[:1]), 'a fused relu': lambda: (A @ B).relu(),
        'a bias and a residual': lambda: Tensor(r) + (A @ Bt.T + Tensor(bias)),
        'a bias and gelu': lambda: (A @ B + Tensor(bias)).gelu(),
        'relu before, exp after': lambda: (A.relu() @ (B * Tensor(bias))).exp()}
products, tuned = {}, {}
for name, make in made.items():
    before = webgpu.tuned_matmuls
    products[name] = make().numpy()
    tuned[name] = webgpu.tuned_matmuls - before
webgpu.tuned_matmul = 'measure'
measured = (Tensor(c[:40, :24]) @ Tensor(d[:24, :56])).numpy()  # the faster kernel, either way the same values
measured_fused = (Tensor(c[:40, :24]) @ Tensor(d[:24, :56]) + Tensor(d[0, :56])).relu().numpy()
"""


def test_tinygrads_matmuls_run_the_tuned_kernel_and_equal_numpys(ip: InteractiveShell) -> None:
    rng = np.random.default_rng(6)
    a, b = rng.standard_normal((33, 17), dtype=np.float32), rng.standard_normal((17, 9), dtype=np.float32)
    c, d = rng.standard_normal((70, 130), dtype=np.float32), rng.standard_normal((130, 67), dtype=np.float32)
    bias, r = rng.standard_normal(9, dtype=np.float32), rng.standard_normal((33, 9), dtype=np.float32)
    ip.user_ns.update(a=a, b=b, c=c, d=d, bias=bias, r=r)
    _run(ip, "%%offload\n" + TUNED_PRODUCTS)
    x = a @ b + bias
    expected = {"x @ w": a @ b, "x @ w.T": a @ b, "g.T @ x": a @ b, "w.T @ x.T": a @ b, "(x @ w).T": (a @ b).T,
                "x @ x.T": a @ a.T, "past the tiles": c @ d, "one row": a[:1] @ b, "K = 1": a[:, :1] @ b[:1],
                "a fused relu": np.maximum(a @ b, 0), "a bias and a residual": r + x,
                "a bias and gelu": 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3))),
                "relu before, exp after": np.exp(np.maximum(a, 0) @ (b * bias))}
    products, tuned = ip.user_ns["products"], ip.user_ns["tuned"]
    for name, value in expected.items():
        np.testing.assert_allclose(products[name], value, rtol=1e-5, atol=1e-5, err_msg=name)
    # each product ran the tuned kernel once, with what tinygrad fused into its kernel before (a prologue) or after
    # (an epilogue); a side of 1 is not one, and stays tinygrad's
    assert tuned == {name: int(name not in ("one row", "K = 1")) for name in expected}, tuned
    np.testing.assert_allclose(ip.user_ns["measured"], c[:40, :24] @ d[:24, :56], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ip.user_ns["measured_fused"], np.maximum(c[:40, :24] @ d[:24, :56] + d[0, :56], 0),
                               rtol=1e-5, atol=1e-5)


def test_a_fused_products_launch_is_saved_and_read_back_whole() -> None:
    from remote_magic.worker.gpu.tinygrad_fused import Gemm
    from remote_magic.worker.gpu.tinygrad_matmul import Launch, Stage

    epilogue = Stage("E_4_16", "@compute fn E_4_16() {}", (None, 0, 3), (4, 1, 1), (16, 1, 1))
    prologue = Stage("E_8_4", "@compute fn E_8_4() {}", (1, None), (8, 1, 1), (4, 1, 1))
    launch = Launch(Gemm(64, 16, 32, 0, 5, 2, trans_a=False, trans_b=True), None, None, 2, prologue_a=prologue,
                    epilogue=epilogue)
    assert Launch.parse(launch.source().encode()) == launch
    plain = Launch(Gemm(64, 16, 32, 0, 1, 2, trans_a=True, trans_b=False), 2, 0, 1)
    assert Launch.parse(plain.source().encode()) == plain and Launch.parse(b"fn main() {}") is None


def test_a_tuned_matmul_setting_of_no_known_kind_says_which_there_are(ip: InteractiveShell) -> None:
    with capture_output():
        result = ip.run_cell("%%offload\nfrom tinygrad import Tensor, Device\n"
                             "Device['WEBGPU'].tuned_matmul = 'sometimes'\n"
                             "try:\n    (Tensor.ones(19, 7).contiguous() @ Tensor.ones(7, 5).contiguous()).numpy()\n"
                             "finally:\n    Device['WEBGPU'].tuned_matmul = 'measure'")
    message = str(result.error_in_exec)
    assert not result.success and "'sometimes'" in message and "'measure'" in message and "'never'" in message


def test_a_kernel_choice_a_cell_forces_is_not_saved_for_the_next_executor(ip: InteractiveShell) -> None:
    rng = np.random.default_rng(9)
    a, b = rng.standard_normal((37, 21), dtype=np.float32), rng.standard_normal((21, 13), dtype=np.float32)
    ip.user_ns.update(a=a, b=b)
    _run(ip, "%%offload\n"
             "import pickle\nfrom tinygrad import Tensor, Device\n"
             "webgpu = Device['WEBGPU']\nwebgpu.tuned_matmul = 'always'\nbefore = webgpu.tuned_matmuls\n"
             "forced = (Tensor(a) @ Tensor(b)).numpy()\nran_tuned = webgpu.tuned_matmuls - before\n"
             "webgpu.tuned_matmul = 'measure'\n(Tensor(a) + 1).numpy()  # (a program to save)\n"
             "webgpu.programs.save()\n"
             "saved = [p.arg.name for p in pickle.loads(webgpu.programs.path.read_bytes())['programs'].values()]")
    np.testing.assert_allclose(ip.user_ns["forced"], a @ b, rtol=1e-5, atol=1e-5)
    assert ip.user_ns["ran_tuned"] == 1  # this executor ran the forced choice...
    saved = ip.user_ns["saved"]
    assert saved and not any(name.startswith("matmul_tuned_37_13_21") for name in saved), saved  # ...none later


def test_a_training_step_through_the_tuned_matmul_matches_numpy(ip: InteractiveShell) -> None:
    rng = np.random.default_rng(7)
    x, w1, w2, target = (rng.standard_normal(shape, dtype=np.float32)
                         for shape in ((24, 12), (16, 12), (10, 16), (24, 10)))
    ip.user_ns.update(x=x, w1=w1, w2=w2, target=target)
    _run(ip, "%%offload\n"
             "from tinygrad import Tensor, Context, Device\nfrom tinygrad.nn.optim import SGD\n"
             "webgpu = Device['WEBGPU']\nwebgpu.tuned_matmul, before = 'always', webgpu.tuned_matmuls\n"
             "first, second = Tensor(w1), Tensor(w2)\nopt = SGD([first, second], lr=0.1)\n"
             "with Context(TRAINING=1):\n"
             "    opt.zero_grad()\n"
             "    loss = (((Tensor(x) @ first.T).relu() @ second.T - Tensor(target)) ** 2).mean()\n"
             "    loss.backward()\n    loss.realize()\n    opt.step()\n"  # (the loss before the step)
             "stepped, loss = (first.numpy(), second.numpy()), loss.item()\nran = webgpu.tuned_matmuls - before\n"
             "webgpu.tuned_matmul = 'measure'\ndel first, second, opt")
    hidden = x @ w1.T
    error = np.maximum(hidden, 0) @ w2.T - target
    out_gradient = 2 * error / error.size
    gradients = ((out_gradient @ w2 * (hidden > 0)).T @ x, out_gradient.T @ np.maximum(hidden, 0))
    # all 6 of its products' kernels (1 before epilogues and prologues: tinygrad fuses elementwise work into the
    # others, a bias or a mask before or after the product)
    assert ip.user_ns["ran"] == 6
    assert ip.user_ns["loss"] == pytest.approx(float(np.mean(error ** 2)), rel=1e-5)
    for stepped, weight, gradient in zip(ip.user_ns["stepped"], (w1, w2), gradients):
        np.testing.assert_allclose(stepped, weight - 0.1 * gradient, rtol=1e-5, atol=1e-5)


SPLIT_PRODUCTS = """
from tinygrad import Tensor, Device
from remote_magic.worker.gpu.matmul import choose_tiling
webgpu = Device['WEBGPU']
# (as the tuned matmul chooses for a transposed operand, which the subgroup kernel doesn't read)
m, n, k = next(dims for dims in candidates
               if choose_tiling(webgpu.matmul_context(), dims, 1, subgroups=False).split > 1)
x, w, bias = a[:m, :k], b[:k, :n], b[0, :n]
made = {'x @ w.T': lambda: Tensor(x) @ Tensor(w.T.copy()).T, 'g.T @ x': lambda: Tensor(x.T.copy()).T @ Tensor(w),
        'with a bias and relu': lambda: (Tensor(x) @ Tensor(w.T.copy()).T + Tensor(bias)).relu()}
webgpu.tuned_matmul = 'always'
products, kernels = {}, {}
for name, make in made.items():
    with webgpu.kernel_times() as times:
        products[name] = make().numpy()
    kernels[name] = sorted(times.dispatches)
webgpu.tuned_matmul = 'measure'
"""


def test_a_product_too_small_to_fill_the_gpu_splits_k_and_equals_numpys(ip: InteractiveShell) -> None:
    rng = np.random.default_rng(8)
    a, b = rng.standard_normal((128, 8192), dtype=np.float32), rng.standard_normal((8192, 256), dtype=np.float32)
    # one tile of C on a software adapter of up to 32 threads; 32 on a GPU
    ip.user_ns.update(a=a, b=b, candidates=[(24, 20, 8192), (128, 256, 8192)])
    _run(ip, "%%offload\n" + SPLIT_PRODUCTS)
    m, n, k = ip.user_ns["m"], ip.user_ns["n"], ip.user_ns["k"]
    product = a[:m, :k].astype(np.float64) @ b[:k, :n]
    expected = {"x @ w.T": product, "g.T @ x": product, "with a bias and relu": np.maximum(product + b[0, :n], 0)}
    for name, value in expected.items():
        assert rel_err(ip.user_ns["products"][name], value) < 1e-5, name
        # the parts' products, then their sum (and for the last, its epilogue: the bias and relu)
        assert any(kernel.endswith("_sum_splits") for kernel in ip.user_ns["kernels"][name]), ip.user_ns["kernels"]


def test_a_tensor_over_the_binding_limit_says_so(ip: InteractiveShell, ml_worker: WorkerProcess) -> None:
    with remote_magic.connect(ml_worker.token) as client:
        [info] = client.workers()
    limit = info["gpu"]["limits"]["max_storage_buffer_binding_size"]
    with capture_output():
        result = ip.run_cell(f"%%offload\nfrom tinygrad import Tensor\nTensor.zeros({limit // 4 + 1}).contiguous()"
                             ".realize()")
    message = str(result.error_in_exec)
    assert not result.success and f"{limit + 4:,} bytes" in message and f"({limit:,} bytes" in message, message


def test_float64_says_webgpu_has_none(ip: InteractiveShell) -> None:
    ip.user_ns["x"] = np.array([1.5, 2.5])  # numpy's float64: a float64 Tensor
    with capture_output():
        result = ip.run_cell("%%offload\nfrom tinygrad import Tensor\n(Tensor(x) * 3).numpy()")
    assert not result.success
    assert "WebGPU has no float64" in str(result.error_in_exec) and ".float()" in str(result.error_in_exec)


def test_a_device_array_becomes_a_tensor_without_an_upload(ml_worker: WorkerProcess) -> None:
    x = np.random.default_rng(5).standard_normal((128, 64)).astype(np.float32)
    with remote_magic.connect(ml_worker.token) as client:
        first = client.execute("doubled = x * 2", inputs={"x": x}, gpu=True)  # a kernel: x is kept on the GPU
        assert first.stats["bytes_uploaded"] == x.nbytes, first.stats
        second = client.execute("from tinygrad import Tensor\nplus_one = (Tensor(x) + 1).numpy()", inputs={"x": x},
                                gpu=True)
    np.testing.assert_array_equal(second.values["plus_one"], x + 1)
    assert second.stats["bytes_uploaded"] == 0, second.stats  # copied on the GPU from the buffer the kernel used
    assert second.stats["resident_hits"] == 1 and second.stats["bytes_resident"] == x.nbytes, second.stats


def test_running_out_of_gpu_memory_names_the_sizes(ip: InteractiveShell) -> None:
    with capture_output():
        result = ip.run_cell("%%offload\nfrom tinygrad import Tensor, Device\n"
                             "kept = Tensor.ones(1000).contiguous().realize()\ndevice = Device['WEBGPU']\n"
                             "held = sum(device.allocator.held.values())\ndevice.memory_limit = held + 6000\n"
                             "try:\n    Tensor.ones(2000).contiguous().realize()\n"
                             "finally:\n    device.memory_limit = None")
    message = str(result.error_in_exec)
    assert not result.success and "ran out of GPU memory" in message, message
    assert "a tensor of 8,000 bytes was asked for" in message and "memory_limit = " in message, message
    held = re.search(r"with ([\d,]+) bytes in (\d+) tensors' buffers held already \(the largest: ", message)
    assert held and int(held.group(1).replace(",", "")) >= 4000, message
    _run(ip, "%%offload\nfrom tinygrad import Tensor\nafter = (Tensor.ones(4) + 1).numpy()")  # allocations go on
    np.testing.assert_array_equal(ip.user_ns["after"], [2.0] * 4)


ALIASED = """
from tinygrad import Tensor
from tinygrad.engine.realize import runtime_cache

x, y = Tensor([1.0, 2.0, 3.0, 4.0]).realize(), Tensor([10.0, 20.0, 30.0, 40.0]).realize()
before = set(runtime_cache)
out = (x * 2.5 + y).realize()
[program] = [runtime_cache[key] for key in set(runtime_cache) - before]  # its kernel: out = x * 2.5 + y
buffer = lambda tensor: tensor.uop.buffer._buf
program(buffer(out), buffer(x), buffer(x))  # x read through two bindings
read_twice = out.numpy()
program(buffer(x), buffer(x), buffer(y))  # x written through one binding and read through another
in_place = x.numpy()
"""
ALIASED_READ_TWICE = np.array([1, 2, 3, 4], np.float32) * 3.5
ALIASED_IN_PLACE = np.array([1, 2, 3, 4], np.float32) * 2.5 + np.array([10, 20, 30, 40], np.float32)


def test_the_tuned_matmuls_own_buffers_count_against_the_memory_limit_until_its_program_goes(
        ip: InteractiveShell) -> None:
    rng = np.random.default_rng(11)
    a, b = rng.standard_normal((41, 19), dtype=np.float32), rng.standard_normal((19, 23), dtype=np.float32)
    ip.user_ns.update(a=a, b=b)
    with capture_output():
        result = ip.run_cell(
            "%%offload\nimport gc\nfrom tinygrad import Tensor, Device\n"
            "from tinygrad.engine.realize import runtime_cache\n"
            "webgpu = Device['WEBGPU']\nallocator = webgpu.allocator\nwebgpu.tuned_matmul = 'always'\n"
            "before = sum(allocator.held_by_programs.values())\n"
            "fused = (Tensor(a) @ Tensor(b)).relu().numpy()  # the product into a buffer of its own, then the relu\n"
            "own = sum(allocator.held_by_programs.values()) - before\n"
            "webgpu.memory_limit = allocator.held_bytes + 100\n"
            "try:\n    Tensor.ones(64).contiguous().realize()\n"
            "finally:\n    webgpu.memory_limit, webgpu.tuned_matmul = None, 'measure'")
    assert "fused" in ip.user_ns, result.error_in_exec
    np.testing.assert_allclose(ip.user_ns["fused"], np.maximum(a @ b, 0), rtol=1e-5, atol=1e-5)
    assert ip.user_ns["own"] == 3776  # 41 x 23 float32s (3,772 bytes) in whole 16 bytes
    message = str(result.error_in_exec)
    assert not result.success and "a tensor of 256 bytes was asked for" in message, message
    counted = re.search(r"and ([\d,]+) bytes in the tuned matmul's own buffers\.", message)
    assert counted and int(counted.group(1).replace(",", "")) >= ip.user_ns["own"], message
    _run(ip, "%%offload\nruntime_cache.clear()\ngc.collect()\nleft = sum(allocator.held_by_programs.values())")
    assert ip.user_ns["left"] == 0  # tinygrad let its programs go, and their buffers with them


def test_a_kernel_binding_one_buffer_twice_reads_a_copy(ip: InteractiveShell) -> None:
    """WebGPU forbids binding one buffer twice where either binding is writable (Chrome rejects the dispatch,
    wgpu runs it): the worker binds a copy for the reads, as a tab does, with the values the kernel reads first."""
    _run(ip, "%%offload\n" + ALIASED)
    np.testing.assert_array_equal(ip.user_ns["read_twice"], ALIASED_READ_TWICE)
    np.testing.assert_array_equal(ip.user_ns["in_place"], ALIASED_IN_PLACE)


OPS_IN_A_TAB = """
from tinygrad import Tensor
import numpy as np

rng = np.random.default_rng(0)
a, w = rng.standard_normal((4, 3, 10, 10), dtype=np.float32), rng.standard_normal((5, 3, 3, 3), dtype=np.float32)
m = rng.standard_normal((16, 24), dtype=np.float32)
order = np.argsort(m, axis=1)[:, :5].astype(np.int32)

def ops(device):
    A, W, M = Tensor(a, device=device), Tensor(w, device=device), Tensor(m, device=device)
    G = Tensor(m, device=device)
    ((G.relu() * G.exp()).sum()).backward()
    return {"conv2d": A.conv2d(W, padding=1), "max_pool2d": A.max_pool2d(), "matmul": M @ M.T,
            "softmax": M.softmax(axis=1), "layernorm": M.layernorm(), "cumsum": M.cumsum(axis=1),
            "sort": M.sort(dim=1)[0], "topk": M.topk(3, dim=1)[0], "argmax": M.argmax(axis=1),
            "gather": M.gather(1, Tensor(order, device=device)), "gradient": G.grad,
            "float16": (M.half() * 3 + 1).float()}  # (emulated in float32: the same WGSL for naga and Chrome)

tab, cpu = ops("WEBGPU"), ops("CPU")
differences = {name: float(np.max(np.abs(tab[name].numpy() - cpu[name].numpy()))) for name in tab}
"""

ENDLESS = """
from tinygrad import Tensor
x = Tensor.ones(32, 32).contiguous().realize()
while True:
    x = (x @ x * 0.03).realize()
    x.numpy()
"""


LINK = re.compile(r"(https?://127\.0\.0\.1:\d+)/#(\S+)")
NOTEBOOK = Path(__file__).parents[2] / "examples" / "train_on_a_tab.ipynb"


TUNED_IN_A_TAB = """
import numpy as np
from tinygrad import Tensor, Device
webgpu = Device['WEBGPU']
webgpu.tuned_matmul, before = 'always', webgpu.tuned_matmuls
rng = np.random.default_rng(8)
a, b = rng.standard_normal((21, 13), dtype=np.float32), rng.standard_normal((13, 6), dtype=np.float32)
A, B = Tensor(a), Tensor(b)
products = [(A @ B).numpy(), (A @ Tensor(b.T.copy()).T).numpy(), (Tensor(a.T.copy()).T @ B).numpy()]
worst = max(float(np.abs(product - a @ b).max()) for product in products)
ran = webgpu.tuned_matmuls - before
webgpu.tuned_matmul = 'measure'
"""


@pytest.mark.timeout(600)  # a backstop (the notebook has its own 300 s a cell): 22 s idle, 58 s with both cores busy
def test_the_example_notebook_trains_a_model_in_a_browser_tab(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """examples/train_on_a_tab.ipynb in a real Jupyter kernel, its model learning on a tab's WebGPU (Chromium's;
    SwiftShader without a GPU) through a worker started with --browser."""
    chromium_path()
    hub = start_worker(tmp_path / "hub", "--listen", "127.0.0.1:0", "--gpu", "off", "--name", "machine",
                       "--browser", "127.0.0.1:0", cwd=tmp_path)
    try:
        with chromium() as browser:
            found = wait_for(lambda: LINK.search(hub.log()), 10, "remote-worker to print the link")
            page = open_tab(browser, f"{found.group(1)}/?name=phone#{found.group(2)}")  # type: ignore[attr-defined]
            monkeypatch.setenv("REMOTE_MAGIC_TOKEN", hub.token)
            nb = nbformat.read(NOTEBOOK, as_version=4)
            NotebookClient(nb, kernel_name="python3", timeout=300,
                           resources={"metadata": {"path": str(tmp_path)}}).execute()
            _, fleet, _, model, train, check = [c for c in nb.cells if c.cell_type == "code"]
            assert "tabs in the fleet: phone" in cell_text(fleet)
            assert "tinygrad computes on WEBGPU" in cell_text(model)
            first, last = map(float, re.search(r"loss ([\d.]+) -> ([\d.]+)", cell_text(train)).groups())  # type: ignore[union-attr]
            assert last < first / 100, cell_text(train)
            assert "close to the true weights: True" in cell_text(check)
            assert batches_run(page) > 0, "the kernels ran in the tab"

            # tinygrad's ops in the tab against tinygrad's CPU device on the worker's machine
            with remote_magic.connect(hub.token, timeout=10) as client:
                differences = client.execute(OPS_IN_A_TAB, worker="phone").values["differences"]
            assert len(differences) == 12, differences
            # float16 computes with float32 in between (no shader-f16): within float16's rounding of the CPU's
            assert all(d <= (2e-2 if name == "float16" else 1e-4) for name, d in differences.items()), differences

            # a kernel binding one buffer twice, which Chrome's WebGPU rejects: the tab computes what the worker does
            with remote_magic.connect(hub.token, timeout=10) as client:
                aliased = client.execute(ALIASED, worker="phone").values
            np.testing.assert_array_equal(aliased["read_twice"], ALIASED_READ_TWICE)
            np.testing.assert_array_equal(aliased["in_place"], ALIASED_IN_PLACE)

            # the tuned matmul in tinygrad's place, each layout, in the tab (Chrome's compiler, the tab's device)
            with remote_magic.connect(hub.token, timeout=10) as client:
                tuned = client.execute(TUNED_IN_A_TAB, worker="phone").values
            assert tuned["ran"] == 3 and tuned["worst"] < 1e-5, tuned
            # a jitted function replayed in the tab (its kernels made once go as one call), each call's own answer
            inputs = _jitted_inputs()
            with remote_magic.connect(hub.token, timeout=10) as client:
                replayed = client.execute(JITTED_WITH_NEW_INPUTS, inputs=inputs, outputs=JITTED_OUTPUTS,
                                          worker="phone").values
            _check_jitted_replays(replayed, **inputs)
            # kernels are timed by timestamp queries, which a tab's device doesn't ask for: the cell says so
            with remote_magic.connect(hub.token, timeout=10) as client, \
                    pytest.raises(RemoteMagicError, match="doesn't offer timestamp queries, so its kernels can't"):
                client.execute("from tinygrad import Device\nwith Device['WEBGPU'].kernel_times():\n    pass",
                               worker="phone")

            # The tab's device lost mid-training: the cell fails saying so, and the next gets a new device.
            with remote_magic.connect(hub.token, timeout=10) as client:
                job = in_thread(lambda: client.execute(ENDLESS, worker="phone"), "an endless tinygrad loop")
                before = batches_run(page)
                wait_for(lambda: batches_run(page) > before + 5, 60, "the loop's kernels to reach the tab")
                page.evaluate("() => { for (const o of objects.values()) if (o instanceof GPUDevice) o.destroy(); }")
                with pytest.raises(RemoteMagicError, match="lost"):
                    job.result(timeout=60)
                again = client.execute("from tinygrad import Tensor\nv = (Tensor([1.0, 2.0]) + 1).numpy()",
                                       worker="phone")
                np.testing.assert_array_equal(again.values["v"], [2.0, 3.0])
    finally:
        hub.stop()
