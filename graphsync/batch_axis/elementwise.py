"""Elementwise ops: each output element reads the same element of each input, broadcast. The batch
stays on its axes, shifted by the rank an input gains in the broadcast; inputs that carry it on
axes that do not nest end the trace. IdentityN passes each input to its output."""
from __future__ import annotations

from graphsync.batch_axis.axes import rank_of
from graphsync.batch_axis.registry import End, register

ELEMENTWISE = frozenset("""
Abs Acos Acosh Add AddV2 AddN Asin Asinh Atan Atan2 Atanh BiasAdd Cast Ceil CheckNumerics ClipByValue Cos
Cosh DebugIdentity Digamma Div DivNoNan Elu EnsureShape Equal Erf Erfc Exp Expm1 Floor FloorDiv FloorMod
Greater GreaterEqual Identity Inv IsFinite IsInf IsNan LeakyRelu Less LessEqual Lgamma Log Log1p
LogicalAnd LogicalNot LogicalOr Maximum Minimum Mod Mul MulNoNan Neg NotEqual OnesLike Pow
PreventGradient RealDiv Reciprocal Relu Relu6 Rint Round Rsqrt Select SelectV2 Selu Sigmoid Sign Sin
Sinh Snapshot Softplus Softsign Sqrt Square SquaredDifference StopGradient Sub Tan Tanh TruncateDiv
Xdivy Xlogy ZerosLike BitwiseAnd BitwiseOr BitwiseXor Angle Real Imag Conj Complex
ReluGrad Relu6Grad LeakyReluGrad EluGrad SeluGrad TanhGrad SigmoidGrad SoftplusGrad SoftsignGrad
RsqrtGrad SqrtGrad ReciprocalGrad InvGrad
""".split())   # the activations' gradient kernels are elementwise too, and a forward may use them


@register("elementwise", *ELEMENTWISE)
def _broadcast(op, ins, context):
    out_rank = rank_of(op.outputs[0]) if op.outputs else None
    found = set()
    for t, axes in zip(op.inputs, ins):
        if not axes:
            continue
        rank = rank_of(t)
        if rank == out_rank:
            found.add(axes)
        elif rank is None or out_rank is None:
            raise End(f"{op.type} broadcasts a tensor of unknown rank")
        else:
            found.add(frozenset(a + out_rank - rank for a in axes))
    widest = max(found, key=len) if found else None
    if any(not axes <= widest for axes in found):   # nested sets: a ghost statistic meets its virtual batches
        raise End(f"{op.type} combines inputs that carry the batch on different axes")
    axes = widest
    return [axes] * len(op.outputs), None


@register("elementwise", "IdentityN")
def _identity_n(op, ins, context):
    return list(ins), None
