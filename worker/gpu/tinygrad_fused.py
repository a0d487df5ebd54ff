"""The matrix product a tinygrad kernel computes, found in the kernel's AST as tinygrad schedules it: plain, or with
elementwise work fused around it, before it (a *prologue*, computing an operand) or after it (an *epilogue*, computing
what the kernel stores from the product). ``tinygrad_matmul.py`` runs the tuned matmul in tinygrad's place for what
:func:`fused_product_of` finds, and tinygrad's own kernels (the ASTs of :class:`Fused`) for the work around it.

A plain product is ``C[m, n] = sum_k A[m, k] * B[k, n]`` stored straight into C, every buffer float32 and whole
(WebGPU's tinygrad has no sub-buffer views), each of C, A and B row- or column-major. A fused one is a kernel whose
only reduction is a sum over K of a product of factors each over A's (rows, K) or B's (K, columns). A batch
dimension, a side of 1 or a symbolic size is not one.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from tinygrad.dtype import AddrSpace, dtypes
from tinygrad.uop import Ops
from tinygrad.uop.ops import AxisType, UOp

OUTPUT_AXES = (AxisType.WEAK, AxisType.LOOP, AxisType.GLOBAL)
"""The kinds of range a product's C is stored over, as tinygrad schedules it (unoptimized)."""


@dataclass(frozen=True)
class Gemm:
    """One plain float32 product of a tinygrad kernel: C (m x n) = A (m x k) @ B (k x n).

    ``out``, ``a``, ``b``: the kernel's parameter slots of C, A and B; ``trans_a``: A is stored k x m;
    ``trans_b``: B is stored n x k (C is row-major: a column-major C is the product of the transposes, swapped).
    """

    m: int
    n: int
    k: int
    out: int
    a: int
    b: int
    trans_a: bool
    trans_b: bool


def _affine(index: UOp) -> dict[UOp | None, int] | None:
    """``index`` as coefficients of its ranges (None: the constant), if it is only sums and constant multiples
    of ranges; else None."""
    if index.op is Ops.CONST and type(index.arg) is int:
        return {None: index.arg}
    if index.op is Ops.RANGE:
        return {index: 1}
    if index.op is Ops.ADD and len(index.src) == 2:
        left, right = _affine(index.src[0]), _affine(index.src[1])
        if left is None or right is None:
            return None
        return {key: left.get(key, 0) + right.get(key, 0) for key in left.keys() | right.keys()}
    if index.op is Ops.MUL and len(index.src) == 2:
        for term, factor in (index.src, index.src[::-1]):
            if factor.op is Ops.CONST and type(factor.arg) is int and (form := _affine(term)) is not None:
                return {key: value * factor.arg for key, value in form.items()}
    return None


def constant_size(node: UOp) -> int | None:
    """The constant size (a range's end, a buffer's elements) in ``node``'s first source, if it is one."""
    if len(node.src) >= 1 and node.src[0].op is Ops.CONST and type(node.src[0].arg) is int:
        return int(node.src[0].arg)
    return None


def _float_buffer(node: UOp) -> tuple[int, int, dict[UOp | None, int]] | None:
    """A float32 buffer's slot, its elements and its index's coefficients, if ``node`` reads or writes one
    whole buffer at an affine index without a gate; else None."""
    if node.op is not Ops.INDEX or len(node.src) != 2 or node.dtype != dtypes.float:
        return None
    param, index = node.src
    size = constant_size(param)
    if (param.op is not Ops.PARAM or param.dtype != dtypes.float or param.arg.dtype != dtypes.float or size is None
            or param.arg.addrspace is not AddrSpace.GLOBAL):
        return None
    form = _affine(index)
    if form is None or form.pop(None, 0) != 0 or any(value == 0 for value in form.values()):
        return None
    return param.arg.slot, size, form


@dataclass(frozen=True)
class Fused:
    """A kernel's product, and the ASTs of tinygrad kernels for the work fused around it (:func:`fused_product_of`).

    ``a``, ``b``: a prologue, where the operand is computed in the kernel rather than read from a buffer as it is:
    a kernel storing it, row-major, into a buffer of its own (the gemm's slot for the operand). ``epilogue``: where
    the kernel stores a function of the product's elements rather than the product: the kernel with the product
    read, row-major, from a buffer of its own (``product``, the slot past the kernel's last)."""

    gemm: Gemm
    product: int
    a: UOp | None = None
    b: UOp | None = None
    epilogue: UOp | None = None

    @property
    def plain(self) -> bool:
        """Nothing is fused: the kernel stores the product of two buffers."""
        return self.a is None and self.b is None and self.epilogue is None


def fused_product_of(ast: UOp) -> Fused | None:
    """The one product a kernel's AST (as tinygrad schedules it) stores, plain or with work fused around it; None
    if its only reduction is not a sum of products over C's rows and columns (see the module docstring)."""
    if ast.op is not Ops.SINK or ast.tag is not None or len(ast.src) != 1 or ast.src[0].op is not Ops.END:
        return None
    end = ast.src[0]
    store, loops = end.src[0], end.src[1:]
    if store.op is not Ops.STORE or len(store.src) != 2 or len(loops) != 2 or store.src[1].dtype != dtypes.float:
        return None
    reductions = [u for u in store.src[1].toposort() if u.op is Ops.REDUCE]
    if len(reductions) != 1:
        return None
    reduce = reductions[0]
    if reduce.dtype != dtypes.float or reduce.arg != (Ops.ADD, 0) or len(reduce.src) != 2:
        return None
    r_k = reduce.src[1]
    ranges = (*loops, r_k)
    sizes = [constant_size(r) for r in ranges]
    if any(r.op is not Ops.RANGE for r in ranges) or len(set(ranges)) != 3 or any(s is None or s < 2 for s in sizes):
        return None
    if r_k.arg[-1] is not AxisType.REDUCE or any(r.arg[-1] not in OUTPUT_AXES for r in loops):
        return None
    out = _float_buffer(store.src[0])
    if out is None:
        return None
    out_slot, out_size, out_form = out
    if set(out_form) != set(loops):
        return None
    r_n = next((r for r in loops if out_form[r] == 1), None)
    if r_n is None:
        return None
    r_m = loops[0] if r_n is loops[1] else loops[1]
    m, n, k = (int(constant_size(r) or 0) for r in (r_m, r_n, r_k))
    if out_form[r_m] != n or out_size != m * n:
        return None
    sides = _sides(reduce.src[0], r_m, r_n)
    if sides is None:
        return None
    next_slot = max(u.arg.slot for u in ast.toposort() if u.op is Ops.PARAM) + 1
    operands: list[tuple[int, bool, UOp | None]] = []
    for factors, row, column, rows, columns, slot in ((sides[0], r_m, r_k, m, k, next_slot + 1),
                                                      (sides[1], r_k, r_n, k, n, next_slot + 2)):
        read = _float_buffer(factors[0]) if len(factors) == 1 else None
        transposed = None if read is None or set(read[2]) != {row, column} or read[1] != rows * columns else (
            _transposed(read[2], row, column, rows, columns))
        if read is not None and transposed is not None and read[0] != out_slot:
            operands.append((read[0], transposed, None))
        else:  # (a prologue: the operand computed into a buffer of its own)
            operands.append((slot, False, _operand_kernel(ast, store.src[0], factors, (row, column), columns, slot)))
    (a, trans_a, prologue_a), (b, trans_b, prologue_b) = operands
    epilogue = None
    if reduce is not store.src[1]:
        index = store.src[0]
        product = index.src[0].replace(arg=replace(index.src[0].arg, slot=next_slot))
        epilogue = ast.substitute({reduce: index.replace(src=(product, index.src[1]))})
    return Fused(Gemm(m, n, k, out_slot, a, b, trans_a, trans_b), next_slot, prologue_a, prologue_b, epilogue)


def _sides(product: UOp, r_m: UOp, r_n: UOp) -> tuple[list[UOp], list[UOp]] | None:
    """The factors of ``product`` (a float32 expression, under the sum over K) on A's side (over rows and K, or
    neither) and on B's (over K and columns); None if a factor runs over both rows and columns or a side has none."""
    factors = [product]
    while any(f.op is Ops.MUL and f.dtype == dtypes.float for f in factors):
        factors = [g for f in factors for g in (f.src if f.op is Ops.MUL and f.dtype == dtypes.float else (f,))]
    a_side: list[UOp] = []
    b_side: list[UOp] = []
    for factor in factors:
        over = set(factor.toposort())
        if r_m in over and r_n in over:
            return None
        (b_side if r_n in over else a_side).append(factor)
    return (a_side, b_side) if a_side and b_side and product.dtype == dtypes.float else None


def _operand_kernel(ast: UOp, out: UOp, factors: list[UOp], axes: tuple[UOp, UOp], columns: int, slot: int) -> UOp:
    """The AST of a kernel storing the product of ``factors`` over ``axes`` (rows, columns: the reduction's range
    among them made a loop) row-major into a float32 buffer in ``slot`` (made like ``out``, C's index)."""
    loops = {r: r.replace(arg=(*r.arg[:-1], AxisType.LOOP)) for r in axes if r.arg[-1] is AxisType.REDUCE}
    row, column = (loops.get(r, r) for r in axes)
    value = factors[0]
    for factor in factors[1:]:
        value = UOp(Ops.MUL, dtypes.float, src=(value, factor))
    size = UOp(Ops.CONST, dtypes.weakint, arg=(constant_size(row) or 0) * columns)
    buffer = out.src[0].replace(arg=replace(out.src[0].arg, slot=slot), src=(size,))
    index = UOp(Ops.ADD, dtypes.weakint, src=(UOp(Ops.MUL, dtypes.weakint,
                                                  src=(row, UOp(Ops.CONST, dtypes.weakint, arg=columns))), column))
    store = UOp(Ops.STORE, dtypes.void, src=(out.replace(src=(buffer, index)), value.substitute(loops)))
    return ast.replace(src=(UOp(Ops.END, dtypes.void, src=(store, row, column)),))


def _transposed(form: dict[UOp | None, int], row: UOp, column: UOp, rows: int, columns: int) -> bool | None:
    """Whether an operand indexed by ``form`` over ``row`` and ``column`` (a rows x columns matrix) is stored
    transposed (False: row-major); None when it is neither."""
    return {(columns, 1): False, (1, rows): True}.get((form[row], form[column]))
