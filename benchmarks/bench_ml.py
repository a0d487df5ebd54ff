"""Training steps with tinygrad on the worker's GPU, beside PyTorch, tinygrad's CPU device and numpy (issue 31).

    python benchmarks/bench_ml.py                       # the three models, results.md updated
    python benchmarks/bench_ml.py --models mlp --no-write
    python benchmarks/bench_ml.py --matmuls-only        # tinygrad's matmul beside this project's, its own section
    python benchmarks/bench_ml.py --matmuls-only --beam 2   # and tinygrad's searched kernel (long: minutes each)
    python benchmarks/bench_ml.py --models block --beam 2   # the block with tinygrad's searched kernels too
    python benchmarks/bench_ml.py --kernel-times block  # where a warm step's time goes: each kernel's GPU time

Three models, each a step a notebook would run in a loop:

* **MLP**: 784-512-512-10, a batch of 128, cross-entropy, one Adam step.
* **CNN**: two 3x3 convolutions (16 and 32 channels) with ReLU and 2x2 max pooling, then a linear layer, on
  a batch of 32 28x28 images: cross-entropy, one Adam step.
* **Transformer block**: GPT-2 small's (768 wide, 12 heads, a 3072-wide MLP, pre-LayerNorm, causal
  attention) on 1 x 128 tokens, random weights: forward and backward.

Columns (median seconds of a warm step, the steps interleaved round by round):

* **tinygrad, worker's GPU**: tinygrad's ``WEBGPU`` device as an offloaded cell gets it
  (``worker/gpu/tinygrad_device.py`` on the wgpu adapter remote-worker would choose), the step under
  ``TinyJit``. Its first step (code generation and compiles included) is reported apart, each in a new
  process as a new executor runs it (``DEV=WEBGPU``): with nothing saved; with the programs and schedules an
  earlier process saved (``ProgramCache``: what a worker's next executor finds); and with its programs only
  (the schedules left out, as before they were saved too). The last two interleaved, the faster of two each. A
  first step computes what a warm one does: on a software adapter that is most of it, so the table also gives
  what the first step costs beyond a warm step (setting up: code generation, scheduling, compiling pipelines).
* **tinygrad, CPU**: tinygrad's own CPU device (clang; left out where clang isn't installed), the same jitted step.
* **PyTorch, CPU**: the same model in eager PyTorch on the host's cores.
* **PyTorch, GPU**: the same on PyTorch's GPU device (CUDA or MPS), where the machine has one; the worker's GPU
  column is then divided by this one, else by PyTorch's CPU column.
* **numpy**: the MLP's forward, backward and Adam written out in numpy (the other two have no numpy column).

The MLP and the CNN also run in a browser tab (headless Chromium's WebGPU, as a tab worker's executor runs them),
beside wgpu-py on the same adapter: Chromium's own SwiftShader, which wgpu-py loads through ``VK_ICD_FILENAMES``
(without a GPU, the tab's adapter; comparing the tab with lavapipe would compare two drivers). Each runs in new
processes, taking turns twice, and their warm steps are pooled: the median of both processes' steps.

``--matmuls-only`` measures, in a section of its own, the models' matrix products alone on the worker's GPU:
tinygrad's kernel for ``a @ b`` (jitted), the same with the tuned matmul run in tinygrad's place where it measures
faster (``worker/gpu/tinygrad_matmul.py``; the cell says which kernel ran), this project's tuned matmul
(``worker/gpu/matmul.py``) on the same device, and numpy, each GPU product run to completion, all checked against
numpy; with ``--beam N``, also the kernel tinygrad's search finds (``BEAM=N``), and how long the search took.

``--kernel-times MODEL`` splits a warm step on the worker's GPU, in a section of its own: rounds of a plain step
and of a step whose kernels are each timed by timestamps their own compute pass writes
(``WebGpuDevice.kernel_times``); of the timed step, its kernels' GPU time, the rest (Python, recording and
submitting, the barriers between kernels, waiting for the loss), and the kernels that take most.

Both tinygrad columns start from the same weights (tinygrad's seeded generator), and their first losses are
checked to agree; PyTorch's weights are its own, so its loss is only checked to be finite.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("PARALLEL", "0")

from report import code_version, interleaved_medians, machine, write_section  # noqa: E402

from remote_magic.worker.gpu import tinygrad_hook  # noqa: E402
from remote_magic.worker.gpu.device import open_device  # noqa: E402

SECTION = "## ML training steps: tinygrad on the worker's GPU beside PyTorch (issue 31)"
MATMUL_SECTION = "## tinygrad's matmul beside remote-magic's tuned matmul on the worker's GPU (issue 31)"
KERNEL_TIMES_SECTION = "## Where a warm training step's time goes on the worker's GPU: tinygrad's kernels (issue 31)"
BEAM_SECTION = "## tinygrad's kernel search (BEAM) on a matmul beside its default kernel and the tuned one (issue 31)"
MATMULS = {"MLP layer 1, forward": (128, 784, 512), "block's qkv, forward": (128, 768, 2304),
           "block's MLP down, forward": (128, 3072, 768), "block's MLP up, weight gradient": (768, 128, 3072)}
"""(m, k, n) of products the models' steps compute: an m x k by k x n float32 matmul each."""
MODELS = ("mlp", "cnn", "block")
TITLES = {"mlp": "MLP 784-512-512-10, batch 128, Adam step", "cnn": "CNN 2 conv + linear, batch 32, Adam step",
          "block": "GPT-2 small block, 1x128 tokens, forward + backward"}
WIDTH, HEADS, TOKENS = 768, 12, 128
SWIFTSHADER_ICD = "vk_swiftshader_icd.json"

Step = Callable[[], float]
"""Runs one step to completion; returns its loss."""


# -- tinygrad ----------------------------------------------------------------------------------------
def tinygrad_model(name: str) -> tuple[Any, Callable[[Any], Any], tuple[int, ...], int | None]:
    """A tinygrad model of ``name``: (the model, its loss from its output and labels, the input's shape,
    the classes of its labels, or None for a regression to zeros)."""
    from tinygrad import Tensor, nn

    if name == "mlp":
        layers = [nn.Linear(784, 512), nn.Linear(512, 512), nn.Linear(512, 10)]
        return layers, lambda x: layers[2](layers[1](layers[0](x).relu()).relu()), (128, 784), 10
    if name == "cnn":
        c1, c2, fc = nn.Conv2d(1, 16, 3), nn.Conv2d(16, 32, 3), nn.Linear(32 * 5 * 5, 10)
        return ([c1, c2, fc], lambda x: fc(c2(c1(x).relu().max_pool2d()).relu().max_pool2d().flatten(1)),
                (32, 1, 28, 28), 10)

    class Block:
        def __init__(self) -> None:
            self.ln1, self.ln2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
            self.qkv, self.proj = nn.Linear(WIDTH, 3 * WIDTH), nn.Linear(WIDTH, WIDTH)
            self.up, self.down = nn.Linear(WIDTH, 4 * WIDTH), nn.Linear(4 * WIDTH, WIDTH)

        def __call__(self, x: Tensor) -> Tensor:
            b, t, _ = x.shape
            q, k, v = [part.reshape(b, t, HEADS, WIDTH // HEADS).transpose(1, 2)
                       for part in self.qkv(self.ln1(x)).chunk(3, dim=2)]
            attended = q.scaled_dot_product_attention(k, v, is_causal=True).transpose(1, 2).reshape(b, t, WIDTH)
            x = x + self.proj(attended)
            return x + self.down(self.up(self.ln2(x)).gelu())

    block = Block()
    return block, block, (1, TOKENS, WIDTH), None


@dataclass(frozen=True)
class TinygradStep:
    """A jitted training step (``jitted`` returns the loss, realized) that reads its loss back, as a loop would."""

    jitted: Callable[[], Any]

    def __call__(self) -> float:
        value: float = self.jitted().item()
        return value


def tinygrad_step(name: str, device: str) -> tuple[TinygradStep, float]:
    """A jitted step of ``name`` on tinygrad's ``device``, and how long its first step took."""
    from tinygrad import Context, Tensor, TinyJit, nn
    from tinygrad.nn.optim import Adam

    Tensor.manual_seed(0)
    with Context(DEV=device):
        model, forward, shape, classes = tinygrad_model(name)
        params = nn.state.get_parameters(model)
        Tensor.realize(*params)  # (weights in buffers, as a loaded model has them: else each step computes them anew)
        x = Tensor.randn(*shape, device=device).realize()
        labels = Tensor.randint(shape[0], high=classes, device=device).realize() if classes else None
        opt = Adam(params, lr=1e-3) if classes else None

    @TinyJit
    def jitted() -> Tensor:
        with Context(TRAINING=1):
            out = forward(x)
            if opt is None:
                loss = out.square().mean()
                loss.backward()
                return loss.realize(*[p.grad for p in params if p.grad is not None])
            opt.zero_grad()
            loss = out.sparse_categorical_crossentropy(labels)
            loss.backward()
            opt.step()
            return loss.realize()

    step = TinygradStep(jitted)
    start = time.perf_counter()
    step()
    return step, time.perf_counter() - start


# -- PyTorch -----------------------------------------------------------------------------------------
def torch_gpu() -> str | None:
    """PyTorch's GPU device on this machine ("cuda" or "mps"), or None where it has none."""
    try:
        import torch
    except ImportError:
        return None
    if torch.cuda.is_available():
        return "cuda"
    return "mps" if torch.backends.mps.is_available() else None


def torch_step(name: str, device: str = "cpu") -> Step:
    """The same step in eager PyTorch on ``device`` (its loss read back, so a GPU's step runs to completion)."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    classes: int | None = 10
    with torch.device(device):  # (the model, its input and labels made there)
        if name == "mlp":
            model: nn.Module = nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                                             nn.Linear(512, 10))
            x = torch.randn(128, 784)
        elif name == "cnn":
            model = nn.Sequential(nn.Conv2d(1, 16, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(16, 32, 3), nn.ReLU(),
                                  nn.MaxPool2d(2), nn.Flatten(), nn.Linear(32 * 5 * 5, 10))
            x = torch.randn(32, 1, 28, 28)
        else:
            model, x, classes = torch_block(), torch.randn(1, TOKENS, WIDTH), None
        labels = torch.randint(0, classes or 1, (x.shape[0],))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3) if classes else None

    def step() -> float:
        out = model(x)
        if opt is None:
            loss = out.square().mean()
            loss.backward()
            return float(loss.detach())
        opt.zero_grad()
        loss = nn.functional.cross_entropy(out, labels)
        loss.backward()
        opt.step()
        return float(loss.detach())

    return step


def torch_block() -> Any:
    """GPT-2 small's block in PyTorch, as :func:`tinygrad_model` makes it in tinygrad."""
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
            self.qkv, self.proj = nn.Linear(WIDTH, 3 * WIDTH), nn.Linear(WIDTH, WIDTH)
            self.up, self.down = nn.Linear(WIDTH, 4 * WIDTH), nn.Linear(4 * WIDTH, WIDTH)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, t, _ = x.shape
            q, k, v = [part.reshape(b, t, HEADS, WIDTH // HEADS).transpose(1, 2)
                       for part in self.qkv(self.ln1(x)).chunk(3, dim=2)]
            attended = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(attended.transpose(1, 2).reshape(b, t, WIDTH))
            return x + self.down(nn.functional.gelu(self.up(self.ln2(x)), approximate="tanh"))

    return Block()


# -- numpy -------------------------------------------------------------------------------------------
def numpy_mlp_step() -> Step:
    """The MLP's step written out in numpy (float32): forward, softmax cross-entropy, backward, Adam."""
    rng = np.random.default_rng(0)
    sizes = [(784, 512), (512, 512), (512, 10)]
    params = [p for fan_in, fan_out in sizes
              for p in (rng.uniform(-1, 1, (fan_in, fan_out)).astype(np.float32) / np.sqrt(fan_in),
                        np.zeros(fan_out, np.float32))]
    moments = [(np.zeros_like(p), np.zeros_like(p)) for p in params]
    x = rng.standard_normal((128, 784), dtype=np.float32)
    labels = rng.integers(0, 10, 128)
    count = [0]

    def step() -> float:
        activations = [x]
        for i in range(0, len(params), 2):
            z = activations[-1] @ params[i] + params[i + 1]
            activations.append(np.maximum(z, 0) if i < len(params) - 2 else z)
        logits = activations[-1]
        shifted = logits - logits.max(axis=1, keepdims=True)
        probs = np.exp(shifted)
        probs /= probs.sum(axis=1, keepdims=True)
        loss = float(-np.log(probs[np.arange(len(labels)), labels]).mean())
        delta = probs
        delta[np.arange(len(labels)), labels] -= 1
        delta /= len(labels)
        grads: list[np.ndarray] = []
        for i in range(len(params) - 2, -1, -2):
            grads[:0] = [activations[i // 2].T @ delta, delta.sum(axis=0)]
            if i:
                delta = (delta @ params[i].T) * (activations[i // 2] > 0)
        count[0] += 1
        t = count[0]
        for p, g, (m, v) in zip(params, grads, moments):
            m *= 0.9
            m += 0.1 * g
            v *= 0.999
            v += 0.001 * g * g
            p -= 1e-3 * (m / (1 - 0.9 ** t)) / (np.sqrt(v / (1 - 0.999 ** t)) + 1e-8)
        return loss

    return step


# -- matmuls alone -----------------------------------------------------------------------------------
def matmul_runs(device: Any, dims: tuple[int, int, int],
                beam: int = 0) -> tuple[dict[str, Callable[[], float]], float, str]:
    """One m x k by k x n product on ``device`` (the worker's GPU) by tinygrad (its own kernel, and with the tuned
    matmul where that measures faster: ``tinygrad_matmul.py``) and by this project's matmul, and by numpy; each run
    returns its seconds, the GPU's to completion. All GPU results are checked against numpy. ``beam``: also
    tinygrad's kernel found by its search (``BEAM=beam``); the seconds the search took come second (0.0 without
    one; a search tinygrad cached before for this adapter takes none); third, which kernel the tuned column ran
    ("tuned" or "tinygrad's")."""
    from tinygrad import Context, Device, Tensor, TinyJit
    from tinygrad.codegen import to_program_cache

    from remote_magic.worker.gpu.context import DeviceContext
    from remote_magic.worker.gpu.matmul import matmul
    from remote_magic.worker.gpu.stats import Stats

    m, k, n = dims
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((m, k), dtype=np.float32), rng.standard_normal((k, n), dtype=np.float32)
    expected = a.astype(np.float64) @ b.astype(np.float64)
    tolerance = 1e-5 * float((np.abs(a).astype(np.float64) @ np.abs(b).astype(np.float64)).max())

    webgpu = Device[tinygrad_hook.DEVICE_NAME]
    ta, tb = (Tensor(x, device=tinygrad_hook.DEVICE_NAME).realize() for x in (a, b))

    def jitted(search: int, tuned: str = "never") -> Callable[[Any, Any], Any]:
        webgpu.tuned_matmul = tuned  # (tinygrad's own kernel, or the tuned matmul where it measures faster)
        to_program_cache.clear()  # (the product compiled under the other choice would be found there)
        product = TinyJit(lambda x, y: (x @ y).realize())
        with Context(BEAM=search):
            for _ in range(3):  # captured at the second call
                result = product(ta, tb)
        np.testing.assert_allclose(result.numpy(), expected, atol=tolerance)
        return product

    def timed(product: Callable[[Any, Any], Any]) -> Callable[[], float]:
        def run() -> float:
            start = time.perf_counter()
            product(ta, tb)
            webgpu.synchronize()
            return time.perf_counter() - start
        return run

    runs = {"tinygrad": timed(jitted(0))}
    before = webgpu.tuned_matmuls
    runs["tinygrad, tuned"] = timed(jitted(0, "measure"))
    chosen = "tuned" if webgpu.tuned_matmuls > before else "tinygrad's"
    searched = 0.0
    if beam:
        start = time.perf_counter()
        runs[f"tinygrad, BEAM={beam}"] = timed(jitted(beam))
        searched = time.perf_counter() - start

    ctx = DeviceContext(device, Stats())
    ua, ub = ctx.upload(a), ctx.upload(b)
    out, _ = matmul(ctx, ua, (m, k), ub, (k, n))
    np.testing.assert_allclose(ctx.download(out, m * n).reshape(m, n), expected, atol=tolerance)

    def ours_run() -> float:
        start = time.perf_counter()
        matmul(ctx, ua, (m, k), ub, (k, n))
        ctx.submit()
        ctx.wait()
        return time.perf_counter() - start

    def numpy_run() -> float:
        start = time.perf_counter()
        np.matmul(a, b)
        return time.perf_counter() - start

    webgpu.tuned_matmul = "measure"
    return {**runs, "remote-magic": ours_run, "numpy": numpy_run}, searched, chosen


def measure_matmuls(device: Any, repeat: int, budget_s: float, beam: int, products: list[str]) -> str:
    """The section of ``--matmuls-only``: the products of :data:`MATMULS` (those of ``products``, their titles'
    starts, if any are named), each column's median; ``beam``: with tinygrad's searched kernel (``BEAM=beam``)."""
    searched = f"tinygrad, BEAM={beam}"
    columns = ["tinygrad", "tinygrad, tuned", *([searched] if beam else []), "remote-magic", "numpy"]
    rows = []
    for title, dims in MATMULS.items():
        if products and not any(title.startswith(start) for start in products):
            continue
        runs, search_s, chosen = matmul_runs(device, dims, beam)
        medians = interleaved_medians(runs, repeat, budget_s)
        m, k, n = dims
        cells = [f"{medians[column] * 1000:.1f}" for column in columns]
        cells[1] += f" ({chosen})"
        ratios = [f"{medians[column] / medians['remote-magic']:.2f}" for column in columns[:2 + bool(beam)]]
        rows.append(f"| {title}: {m}x{k} @ {k}x{n} | " + " | ".join(cells + ratios) +
                    (f" | {search_s:.0f} |" if beam else " |"))
    names = {"tinygrad": "tinygrad, worker's GPU", "tinygrad, tuned": "tinygrad with the tuned matmul, worker's GPU",
             searched: f"tinygrad BEAM={beam}, worker's GPU", "remote-magic": "remote-magic's matmul, worker's GPU",
             "numpy": "numpy"}
    header = [names[column] for column in columns] + [f"{names[column].split(',')[0]} ÷ remote-magic"
                                                      for column in columns[:2 + bool(beam)]]
    header += [f"BEAM={beam}'s search, s"] if beam else []
    return "\n".join(["| float32 product, ms | " + " | ".join(header) + " |",
                      "| --- | " + " | ".join("---:" for _ in header) + " |", *rows])


# -- where a step's time goes -----------------------------------------------------------------------
def kernel_times(name: str, repeat: int) -> str:
    """A table of where a warm step of ``name`` goes on the worker's GPU: ``repeat`` rounds of a plain step and a
    step timed kernel by kernel, and of the timed ones the kernels' GPU time, the rest, and the kernels taking most."""
    from collections import Counter

    from tinygrad import Device

    step, _ = tinygrad_step(name, "WEBGPU")
    step()  # (the JIT captures the step at its second call, into the graph it replays from the third)
    step()
    plain, host, timed, gpu = [], [], [], []
    seconds: Counter[str] = Counter()
    dispatches: Counter[str] = Counter()
    for _ in range(repeat):
        start, start_cpu = time.perf_counter(), time.thread_time()
        step()
        plain.append(time.perf_counter() - start)
        host.append(time.thread_time() - start_cpu)
        with Device["WEBGPU"].kernel_times() as times:
            start = time.perf_counter()
            step()
            timed.append(time.perf_counter() - start)
        gpu.append(times.total_s)
        seconds.update(times.seconds)
        dispatches.update(times.dispatches)
    rest = [wall - kernels for wall, kernels in zip(timed, gpu)]
    calls, submits, reads = [], [], []  # (each part's own CPU time: the GPU idle, as a fast one would be)
    for _ in range(repeat):
        start_cpu = time.thread_time()
        loss = step.jitted()
        calls.append(time.thread_time() - start_cpu)
        start_cpu = time.thread_time()
        Device["WEBGPU"].submit()
        submits.append(time.thread_time() - start_cpu)
        Device["WEBGPU"].synchronize()
        start_cpu = time.thread_time()
        loss.item()
        reads.append(time.thread_time() - start_cpu)
    lines = [f"**{TITLES[name]}**: a warm step takes {np.median(plain) * 1e3:.2f} ms, of which "
             f"{np.median(host) * 1e3:.2f} ms of its thread's CPU time (Python, recording, submitting); timed kernel "
             "by kernel, "
             f"{np.median(timed) * 1e3:.2f} ms, of which its {sum(dispatches.values()) // repeat} kernel runs "
             f"({len(seconds)} programs) take {np.median(gpu) * 1e3:.2f} ms of GPU time and the rest "
             f"{np.median(rest) * 1e3:.2f} ms (medians of {repeat} rounds). The host's own share, each part timed "
             f"with the GPU idle: the jitted call (recording its kernels) {np.median(calls) * 1e3:.2f} ms of CPU, "
             f"submitting them {np.median(submits) * 1e3:.2f} ms, reading the loss back (tinygrad's `item()` and "
             f"the copy) {np.median(reads) * 1e3:.2f} ms.",
             "", "| kernel | runs a step | GPU ms a step | share of the kernels' time |",
             "| --- | ---: | ---: | ---: |"]
    total = sum(seconds.values())
    for kernel, spent in seconds.most_common(10):
        lines.append(f"| `{kernel}` | {dispatches[kernel] // repeat} | {spent / repeat * 1e3:.3f} | "
                     f"{spent / total:.0%} |")
    return "\n".join(lines)


# -- the table ---------------------------------------------------------------------------------------
def first_step_in_a_new_process(name: str, home: str, *, schedules: bool = True) -> float:
    """Seconds of the first step of ``name`` on the worker's GPU in a new process whose saved programs are in
    ``home`` (``REMOTE_MAGIC_HOME``); it saves what it generated there. ``schedules``: False to leave out the
    schedules saved there (only the programs are used, as before they were saved too)."""
    run = subprocess.run([sys.executable, __file__, "--first-step", name, *([] if schedules else ["--no-schedules"])],
                         capture_output=True, text=True, env={**os.environ, "REMOTE_MAGIC_HOME": home}, check=True,
                         timeout=600)
    return float(run.stdout.split()[-1])


def first_step(name: str, schedules: bool) -> None:
    """(In the process :func:`first_step_in_a_new_process` starts.) Prints the seconds, saves the programs."""
    device = open_device()
    tinygrad_hook.install(lambda: device, default=True)  # (DEV=WEBGPU, as in a worker's executor: before tinygrad)
    from tinygrad import Device
    from tinygrad.schedule import schedule_cache

    webgpu = Device[tinygrad_hook.DEVICE_NAME]
    if not schedules:
        schedule_cache.clear()
    _, seconds = tinygrad_step(name, tinygrad_hook.DEVICE_NAME)
    if schedules:
        webgpu.programs.save()
    print(seconds)


def chromiums_swiftshader() -> Path | None:
    """Chromium's own Vulkan driver, SwiftShader (headless Chromium's WebGPU adapter without a GPU), which wgpu-py
    can run on too (``VK_ICD_FILENAMES``): the tab's adapter under both. None without Chromium."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    folders = [Path(os.path.realpath(chromium)).parent] if chromium else []
    return next((f / SWIFTSHADER_ICD for f in [*folders, Path("/usr/lib/chromium")] if (f / SWIFTSHADER_ICD).exists()),
                None)


def steps_on(name: str, repeat: int, where: str) -> dict[str, Any]:
    """(In a process of its own: tinygrad has one ``WEBGPU`` device per process.) The median warm step of
    ``name``, its first step and the adapter: ``where`` is "tab" (headless Chromium's WebGPU behind a tab bridge,
    as a tab worker's executor runs it) or "wgpu" (wgpu-py on the adapter this process's environment gives)."""
    with contextlib.ExitStack() as stack:
        if where == "tab":
            sys.path.insert(0, str(REPO / "tests"))
            from browser_tabs import tab_bridge

            from remote_magic.worker.gpu.tab_device import open_tab_device

            device = open_tab_device(stack.enter_context(tab_bridge()))
        else:
            device = open_device()
        tinygrad_hook.install(lambda: device, default=False)
        step, first = tinygrad_step(name, tinygrad_hook.DEVICE_NAME)
        times = []
        for _ in range(repeat):
            start = time.perf_counter()
            step()
            times.append(time.perf_counter() - start)
        return {"times": times, "first": first, "adapter": device.info.name}


def measure(name: str, repeat: int, budget_s: float, beam: int = 0) -> tuple[dict[str, float], dict[str, float]]:
    """Warm medians by column, and first-step seconds (new processes on the worker's GPU; tinygrad's CPU); ``beam``:
    also the step with the kernels tinygrad's search finds (``BEAM=beam``), and the seconds it searched ("search")."""
    with tempfile.TemporaryDirectory() as home:
        first = {"new": first_step_in_a_new_process(name, home)}
        saved, programs_only = [], []
        for _ in range(2):  # interleaved: with the programs and schedules saved, and with the programs only
            saved.append(first_step_in_a_new_process(name, home))
            programs_only.append(first_step_in_a_new_process(name, home, schedules=False))
        first.update(saved=min(saved), programs_only=min(programs_only))
    gpu_step, _ = tinygrad_step(name, tinygrad_hook.DEVICE_NAME)
    steps = {"tinygrad, worker's GPU": gpu_step}
    if beam:
        from tinygrad import Context

        start = time.perf_counter()
        with Context(BEAM=beam):
            searched_step, _ = tinygrad_step(name, tinygrad_hook.DEVICE_NAME)
            searched_step()  # (captured by the JIT here: its kernels searched)
        first["search"] = time.perf_counter() - start
        _check_same_loss(name, searched_step(), gpu_step())
        steps[f"tinygrad BEAM={beam}, worker's GPU"] = searched_step
    if shutil.which("clang"):  # (tinygrad's CPU device compiles with it)
        cpu_step, first["CPU"] = tinygrad_step(name, "CPU")
        _check_same_loss(name, gpu_step(), cpu_step())
        steps["tinygrad, CPU"] = cpu_step
    steps["PyTorch, CPU"] = torch_step(name)
    if gpu := torch_gpu():
        steps["PyTorch, GPU"] = torch_step(name, gpu)
    if name == "mlp":
        steps["numpy"] = numpy_mlp_step()
    for step in steps.values():
        assert np.isfinite(step())

    def timed(step: Step) -> Callable[[], float]:
        def run() -> float:
            start = time.perf_counter()
            step()
            return time.perf_counter() - start
        return run

    medians = interleaved_medians({column: timed(step) for column, step in steps.items()}, repeat, budget_s)
    return medians, first


def _check_same_loss(name: str, loss: float, reference: float) -> None:
    """Two tinygrad steps of ``name`` from the same weights agree on the loss (within float32 rounding)."""
    assert abs(loss - reference) <= 1e-3 * max(1.0, abs(reference)), (name, loss, reference)


def steps_in_a_new_process(name: str, repeat: int, where: str) -> dict[str, Any]:
    """:func:`steps_on` of ``name``, run in a new process; wgpu-py's ("wgpu") on Chromium's SwiftShader."""
    env = dict(os.environ)
    if where == "wgpu":
        icd = chromiums_swiftshader()
        if icd is None:
            raise SystemExit("no Chromium: its SwiftShader is the adapter the tab and wgpu-py are compared on")
        env["VK_ICD_FILENAMES"] = str(icd)
    run = subprocess.run([sys.executable, __file__, "--steps-on", where, name, "--repeat", str(repeat)],
                         capture_output=True, text=True, check=True, timeout=1200, env=env)
    found: dict[str, Any] = json.loads(run.stdout.strip().splitlines()[-1])
    return found


def tab_beside_wgpu(name: str, repeat: int, rounds: int = 2) -> tuple[dict[str, Any], dict[str, Any]]:
    """:func:`steps_on` of ``name`` in a tab and with wgpu-py on the tab's adapter, new processes taking turns
    (``rounds`` each: a slow minute of the machine falls on both), their steps pooled: the median warm step and
    the faster first step of each."""
    runs: dict[str, list[dict[str, Any]]] = {"tab": [], "wgpu": []}
    for _ in range(rounds):
        for where, found in runs.items():
            found.append(steps_in_a_new_process(name, repeat, where))
    pooled = [{"median": float(np.median([t for run in found for t in run["times"]])),
               "first": min(run["first"] for run in found), "adapter": found[0]["adapter"]}
              for found in runs.values()]
    return pooled[0], pooled[1]


def render(results: dict[str, tuple[dict[str, float], dict[str, float]]], adapter: str, args: Any,
           load: tuple[float, float], tabs: dict[str, tuple[dict[str, Any], dict[str, Any]]]) -> str:
    from importlib.metadata import version

    import torch

    gpu = torch_gpu()
    searched = [f"tinygrad BEAM={args.beam}, worker's GPU"] if args.beam else []
    columns = ["tinygrad, worker's GPU", *searched, "tinygrad, CPU", "PyTorch, CPU", *(["PyTorch, GPU"] if gpu else []),
               "numpy"]
    baseline = "PyTorch, GPU" if gpu else "PyTorch, CPU"
    torch_gpu_name = f"; PyTorch's GPU: {torch.cuda.get_device_name()}" if gpu == "cuda" else ""
    lines = [f"Measured by `python benchmarks/bench_ml.py {' '.join(sys.argv[1:])}`.", "",
             f"- Machine: {machine()}; PyTorch uses {torch.get_num_threads()} threads{torch_gpu_name}",
             f"- Adapter of the worker's GPU column: {adapter}",
             f"- Python {sys.version.split()[0]}; tinygrad {version('tinygrad')}, torch {torch.__version__}, "
             f"numpy {np.__version__}; {code_version()}",
             f"- Load average (1 min) before / after the run: {load[0]:.2f} / {load[1]:.2f}", "",
             "| warm step, ms | " + " | ".join(columns) + f" | worker's GPU ÷ {baseline} |" +
             "".join(f" {c.split(',')[0]} ÷ {baseline} |" for c in searched),
             "| --- | " + " | ".join("---:" for _ in columns + searched) + " | ---: |"]
    for name, (medians, _) in results.items():
        cells = [f"{medians[c] * 1000:.1f}" if c in medians else "—" for c in columns]
        ratios = [f"{medians[c] / medians[baseline]:.2f}" for c in ["tinygrad, worker's GPU", *searched]]
        lines.append(f"| {TITLES[name]} | " + " | ".join(cells + ratios) + " |")
    if searched:
        took = ", ".join(f"{TITLES[name].split(',')[0]} {first['search']:.0f}" for name, (_, first) in results.items())
        lines += ["", f"BEAM={args.beam}'s search (once per kernel and adapter, in tinygrad's disk cache), s: {took}"]
    lines += ["", "| first step, s | worker's GPU, new executor | worker's GPU, new executor, programs and schedules "
              "saved before | the same, less a warm step's time | the same, programs only | tinygrad, CPU |",
              "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for name, (medians, first) in results.items():
        setup = first["saved"] - medians[columns[0]]
        cpu = f"{first['CPU']:.2f}" if "CPU" in first else "—"
        lines.append(f"| {TITLES[name]} | {first['new']:.2f} | {first['saved']:.2f} | {setup:.2f} | "
                     f"{first['programs_only']:.2f} | {cpu} |")
    if tabs:
        tab, wgpu = next(iter(tabs.values()))
        lines += ["", f"| tinygrad in a browser tab (headless Chromium's WebGPU: {tab['adapter']}) beside wgpu-py on "
                  f"the same adapter ({wgpu['adapter']}, Chromium's own), warm step, ms | wgpu-py | tab | "
                  "tab ÷ wgpu-py | wgpu-py's first step, s | tab's first step, s |",
                  "| --- | ---: | ---: | ---: | ---: | ---: |"]
        for name, (tab, wgpu) in tabs.items():
            lines.append(f"| {TITLES[name]} | {wgpu['median'] * 1000:.1f} | {tab['median'] * 1000:.1f} | "
                         f"{tab['median'] / wgpu['median']:.2f} | {wgpu['first']:.1f} | {tab['first']:.1f} |")
    return "\n".join(lines)


def publish(title: str, flags: str, adapter: str, load_before: float, table: str, footnote: str, *,
            write: bool) -> None:
    """Print a section of its own (``title``) for a run of ``bench_ml.py flags``, and write it into results.md."""
    body = "\n".join([f"Measured by `python benchmarks/bench_ml.py {flags}`.", "",
                      f"- Machine: {machine()}; adapter {adapter}", f"- {code_version()}",
                      f"- Load average (1 min) before / after the run: {load_before:.2f} / {os.getloadavg()[0]:.2f}",
                      "", table, "", footnote])
    print(body)
    if write:
        write_section(title, body)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)}")
    parser.add_argument("--repeat", type=int, default=7, help="rounds at most (default 7)")
    parser.add_argument("--budget", type=float, default=60.0, help="seconds per model after which no round starts")
    parser.add_argument("--tab-models", default="mlp,cnn", help="models also run in a browser tab ('' for none)")
    parser.add_argument("--no-write", action="store_true", help="print only; leave results.md as it is")
    parser.add_argument("--matmuls-only", action="store_true",
                        help="only the models' matrix products: tinygrad's kernel beside this project's matmul")
    parser.add_argument("--beam", type=int, default=0, metavar="N",
                        help="also tinygrad's kernels found by its search, BEAM=N (minutes a product on lavapipe; "
                             "cached per adapter in tinygrad's disk cache): a column of the models' table, or with "
                             "--matmuls-only a section of its own")
    parser.add_argument("--products", default="", metavar="TITLES",
                        help="with --matmuls-only: only the products whose titles start so (comma-separated)")
    parser.add_argument("--kernel-times", metavar="MODELS",
                        help="only where a warm step of these models (comma-separated) goes: each kernel's GPU time")
    parser.add_argument("--first-step", metavar="MODEL", help=argparse.SUPPRESS)  # (a new process's first step)
    parser.add_argument("--no-schedules", action="store_true", help=argparse.SUPPRESS)  # (its saved programs only)
    parser.add_argument("--steps-on", nargs=2, metavar=("WHERE", "MODEL"), help=argparse.SUPPRESS)  # (a new process's)
    args = parser.parse_args()
    if args.first_step:
        return first_step(args.first_step, not args.no_schedules)
    if args.steps_on:
        return print(json.dumps(steps_on(args.steps_on[1], args.repeat, args.steps_on[0])))
    os.environ["REMOTE_MAGIC_HOME"] = tempfile.mkdtemp()  # no programs saved by an earlier run
    load_before = os.getloadavg()[0]
    device = open_device()
    tinygrad_hook.install(lambda: device, default=False)
    adapter = f"{device.info.name} ({device.info.adapter_type}, {device.info.backend})"
    if args.kernel_times:
        tables = [kernel_times(name, args.repeat) for name in args.kernel_times.split(",")]
        publish(KERNEL_TIMES_SECTION, f"--kernel-times {args.kernel_times} --repeat {args.repeat}", adapter,
                load_before, "\n\n".join(tables),
                "Each kernel's time is the span between the timestamps written at the start and end of a compute pass "
                "of its own, in the timed steps (a plain step records all its kernels in one pass); the rest of a "
                "timed step is its Python, recording and submitting, the barriers between kernels, and waiting for "
                "the loss to come back. A plain step's CPU time is its thread's (`time.thread_time`): the host's "
                "share, which a GPU overlaps only with what was submitted before it.", write=not args.no_write)
        return
    if args.matmuls_only:
        products = [start for start in args.products.split(",") if start]
        table = measure_matmuls(device, args.repeat, args.budget, args.beam, products)
        flags = (f"--matmuls-only{f' --beam {args.beam}' if args.beam else ''}"
                 f"{f' --products {args.products!r}' if products else ''} --repeat {args.repeat}")
        publish(BEAM_SECTION if args.beam else MATMUL_SECTION, flags, adapter, load_before, table,
                "Median of each column's runs, the columns interleaved round by round; each GPU product runs to "
                "completion (tinygrad's jitted `a @ b` and a synchronize; remote-magic's `worker/gpu/matmul.py` and a "
                "wait), inputs already on the GPU; each checked against numpy in float64 once. A BEAM column's kernel "
                "is tinygrad's search's pick on this adapter; its search, once per product and adapter, is not in its "
                "time.", write=not args.no_write)
        return
    results = {name: measure(name, args.repeat, args.budget, args.beam) for name in args.models.split(",")}
    tabs = {name: tab_beside_wgpu(name, args.repeat) for name in filter(None, args.tab_models.split(","))}
    body = render(results, adapter, args, (load_before, os.getloadavg()[0]), tabs)
    print(body)
    if not args.no_write:
        write_section(SECTION, body)


if __name__ == "__main__":
    main()
