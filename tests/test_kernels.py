"""trainer.attention_precision: under a 16-bit autocast the attention kernel may run in fp32 (on the CPU, SDPA's fp32
backward beats its bf16 one at short sequences); auto times both at the run's shapes, the journal says which it
took, and a resumed run keeps its checkpoint's choice. The model's own fast paths (torch's fused RMSNorm, the
rotate-half RoPE) keep the numbers of the written-out forms, and linears of one input run as one matmul under
autocast unless something must see each of them called. bf16 logits on the CPU take a chunked cross-entropy with
torch's loss and gradient."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from currytrain.model.layers import Attention, RMSNorm, apply_rope, build_rope_cache, shared_input_linears
from currytrain.model.loss import chunked_cross_entropy, chunked_pays
from currytrain.model.protocol import causal_lm_loss
from currytrain.parallel.kernels import FP32_MARGIN, choose_attention_precision
from currytrain.trainer.trainer import Trainer

RUN = ("trainer.precision=bf16", "trainer.max_steps=4", "trainer.checkpoint_every=2", "trainer.eval_every=1000", "logger=[jsonl]")


def _attention_inputs(seed: int = 0):
    torch.manual_seed(seed)
    attention = Attention(dim=64, n_heads=4, n_kv_heads=2)
    cos, sin = build_rope_cache(16, 16, 10000.0)
    return attention, torch.randn(2, 16, 64, requires_grad=True), cos, sin


def _bf16(attention, x, cos, sin):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        return attention(x, cos, sin)


def test_fp32_attention_runs_the_kernel_in_fp32_while_training_and_in_16_bit_for_inference():
    attention, x, cos, sin = _attention_inputs()
    low = _bf16(attention, x, cos, sin)
    attention.attention_fp32 = True
    high = _bf16(attention, x, cos, sin)
    # The reference: the same q, k, v (bf16 projections, fp32 rotation), the kernel itself in fp32.
    with torch.autocast("cpu", dtype=torch.bfloat16):
        q, k, v = attention.project(x)
        q, k = attention.rotate(q, cos, sin), attention.rotate(k, cos, sin)
    reference = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True, enable_gqa=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = attention.wo(reference.transpose(1, 2).reshape(2, 16, -1))
    assert torch.equal(high, expected)
    assert not torch.equal(high, low)  # the 16-bit kernel gives other numbers: the switch really changed the kernel
    high.float().sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all() and attention.wq.weight.grad is not None
    with torch.no_grad():  # inference: the 16-bit kernel is the faster one forward
        assert torch.equal(_bf16(attention, x, cos, sin), low.detach())


def test_auto_times_both_kernels_on_the_cpu_and_takes_fp32_only_where_clearly_faster(compose_cfg):
    from currytrain.model import build_model

    model = build_model(compose_cfg().model)
    cpu = torch.device("cpu")
    choice = choose_attention_precision(model, "auto", torch.bfloat16, cpu, batch=4, seq_len=32, world_size=1)
    assert choice.numbers["autocast_ms"] > 0 and choice.numbers["fp32_ms"] > 0
    assert choice.fp32 == (choice.numbers["fp32_ms"] <= FP32_MARGIN * choice.numbers["autocast_ms"])
    assert all(m.attention_fp32 == choice.fp32 for m in model.modules() if isinstance(m, Attention))
    assert choice.numbers["shapes"] == [[4, 2, 1, 32, 16, 16]]  # batch, heads, kv heads, tokens, widths of TINY
    # Forced, or nothing to choose: no timing.
    forced = choose_attention_precision(model, "fp32", torch.bfloat16, cpu, 4, 32, 1)
    assert forced.fp32 and "autocast_ms" not in forced.event() and all(m.attention_fp32 for m in model.modules() if isinstance(m, Attention))
    assert choose_attention_precision(model, "auto", None, cpu, 4, 32, 1) is None  # fp32 training: no autocast
    assert choose_attention_precision(model, "auto", torch.bfloat16, cpu, 4, None, 1) is None  # data with no seq_len to time at
    gpu = choose_attention_precision(model, "auto", torch.bfloat16, torch.device("cuda"), 4, 32, 1)
    assert not gpu.fp32 and "cuda" in gpu.reason and not gpu.numbers
    assert not any(m.attention_fp32 for m in model.modules() if isinstance(m, Attention))
    assert not choose_attention_precision(model, "auto", torch.bfloat16, cpu, 4, 32, world_size=2).fp32


def _choices(run_dir) -> list[dict]:
    records = [json.loads(line) for line in (run_dir / "journal.jsonl").read_text().splitlines()]
    return [r for r in records if r["type"] == "attention_precision"]


def test_the_run_journals_its_choice_and_a_resumed_run_keeps_the_checkpoints(compose_cfg, tmp_path):
    run = tmp_path / "run"
    trainer = Trainer(compose_cfg(*RUN, "trainer.max_steps=2"), run)
    trainer.train()
    (first,) = _choices(run)
    assert first["step"] == 0 and isinstance(first["fp32"], bool) and "fp32" in first["reason"]
    # As if the machine that trained the checkpoint had timed the other way: the resumed run keeps that choice.
    journal = run / "journal.jsonl"
    journal.write_text(journal.read_text().replace(f'"fp32": {json.dumps(first["fp32"])}', f'"fp32": {json.dumps(not first["fp32"])}', 1))
    resumed = Trainer(compose_cfg(*RUN, "trainer.resume=auto"), run)
    resumed.train()
    second = _choices(run)[-1]
    assert second["step"] == 2 and second["fp32"] is (not first["fp32"]) and second["reason"].startswith("kept from the checkpoint's run")
    assert all(m.attention_fp32 is (not first["fp32"]) for m in resumed.model.modules() if isinstance(m, Attention))
    # fp32 training autocasts nothing: there is nothing to choose, and nothing is journaled.
    Trainer(compose_cfg("trainer.max_steps=1", "logger=[jsonl]"), tmp_path / "fp32").train()
    assert _choices(tmp_path / "fp32") == []


@pytest.mark.parametrize("shape", [(2, 7, 48), (3, 5, 1000)])
def test_rmsnorm_fused_kernel_and_rotate_half_rope_keep_the_written_out_numbers(shape):
    torch.manual_seed(0)
    norm = RMSNorm(shape[-1], 1e-5)
    norm.weight.data.normal_()
    x = (torch.randn(*shape) * 3).requires_grad_()
    x32 = x.detach()
    written = (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + norm.eps)) * norm.weight.detach()
    assert torch.equal(norm(x), written)
    assert norm(x.bfloat16()).dtype == torch.float32  # bf16 input: the written-out fp32 path (the kernel wants one dtype)
    cos, sin = build_rope_cache(16, 8, 10000.0)
    q = torch.randn(2, 3, 16, 8)
    first, second = q.chunk(2, dim=-1)
    assert torch.equal(apply_rope(q, cos, sin), torch.cat((first * cos - second * sin, second * cos + first * sin), dim=-1))


def test_linears_of_one_input_run_as_one_matmul_under_autocast_unless_each_must_be_called():
    torch.manual_seed(0)
    linears = [torch.nn.Linear(32, width, bias=True) for width in (32, 16, 16)]
    x = torch.randn(2, 40, 32)  # 80 tokens, at least the 64 outputs together: one matmul
    with torch.autocast("cpu", dtype=torch.bfloat16):
        fused = shared_input_linears(x, *linears)
        one = F.linear(x, torch.cat([lin.weight for lin in linears]), torch.cat([lin.bias for lin in linears]))
        separate = [lin(x) for lin in linears]
    assert torch.equal(torch.cat(list(fused), -1), one)  # one matmul over the concatenated weights and biases
    for a, b in zip(fused, separate):
        assert a.shape == b.shape and a.dtype == torch.bfloat16 and torch.allclose(a.float(), b.float(), atol=2e-2)
    # Gradients reach each linear's own weight.
    with torch.autocast("cpu", dtype=torch.bfloat16):
        sum(y.float().sum() for y in shared_input_linears(x, *linears)).backward()
    assert all(lin.weight.grad is not None and lin.weight.grad.shape == lin.weight.shape for lin in linears)
    # fp32: each linear as it is, exactly; and so under autocast where the weights outnumber the tokens (the copy
    # of the weights that concatenating them costs would outweigh what it saves).
    assert all(torch.equal(a, lin(x)) for a, lin in zip(shared_input_linears(x, *linears), linears))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        few = x[:, :20]  # 40 tokens < 64 outputs
        assert all(torch.equal(a, lin(few)) for a, lin in zip(shared_input_linears(few, *linears), linears))
    # A hook (the ladder's dead-unit probe, diagnose) must see each call: the linears run as modules.
    calls = []
    handle = linears[1].register_forward_pre_hook(lambda module, args: calls.append(args[0].shape))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        hooked = shared_input_linears(x, *linears)
    handle.remove()
    assert calls == [x.shape] and all(torch.equal(a, b) for a, b in zip(hooked, separate))

    class Adapter(torch.nn.Linear):  # a subclass (float8, LoRA) keeps its own forward
        def forward(self, x):
            return super().forward(x) * 2

    adapted = [Adapter(32, 16), torch.nn.Linear(32, 16)]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = shared_input_linears(x, *adapted)
        assert torch.equal(out[0], adapted[0](x))


def test_linears_of_one_input_run_as_one_matmul_when_compiled_in_fp32():
    torch.manual_seed(0)
    linears = [torch.nn.Linear(32, width, bias=False) for width in (32, 16, 16)]
    graphs = []

    def recording(graph_module, example_inputs):  # the graph dynamo hands its backend, run as traced
        graphs.append(graph_module)
        return graph_module.forward

    def matmuls(graph_module):
        return sum(node.op == "call_function" and node.target in (F.linear, torch._C._nn.linear) for node in graph_module.graph.nodes)

    projected = torch.compile(lambda x: shared_input_linears(x, *linears), backend=recording, fullgraph=True)
    x = torch.randn(2, 40, 32, requires_grad=True)  # 80 tokens, at least the 64 outputs together: one matmul
    compiled = projected(x)
    assert matmuls(graphs[-1]) == 1
    eager = [lin(x) for lin in linears]  # fp32 eager: each linear as it is
    assert all(a.shape == b.shape and torch.allclose(a, b, atol=1e-6) for a, b in zip(compiled, eager))
    sum(y.sum() for y in compiled).backward()
    grads = [lin.weight.grad.clone() for lin in linears]
    for lin in linears:
        lin.weight.grad = None
    sum(y.sum() for y in eager).backward()
    assert all(torch.allclose(g, lin.weight.grad, atol=1e-5) for g, lin in zip(grads, linears))
    projected(torch.randn(2, 20, 32))  # 40 tokens < 64 outputs: the copy of the weights would cost more than it saves
    assert matmuls(graphs[-1]) == 3


@pytest.mark.parametrize(
    ("tokens", "classes", "dtype"), [(96, 50, torch.bfloat16), (130, 9000, torch.bfloat16), (70, 9000, torch.float32)]
)  # one chunk; several, the last one short
def test_chunked_cross_entropy_has_torchs_loss_and_gradient(tokens, classes, dtype):
    torch.manual_seed(0)
    logits = (torch.randn(tokens, classes) * 4).to(dtype)
    targets = torch.randint(0, classes, (tokens,))
    targets[::3] = -100
    for factor in (1.0, 1 / 3):  # 1/3: the loss of one of three accumulated microbatches
        ours, reference = logits.clone().requires_grad_(), logits.clone().requires_grad_()
        loss = chunked_cross_entropy(ours, targets)
        expected = F.cross_entropy(reference.float(), targets)
        (loss * factor).backward()
        (expected * factor).backward()
        assert loss.dtype == torch.float32 and torch.allclose(loss, expected, rtol=1e-6, atol=0)
        assert ours.grad.dtype == dtype
        # fp32 rounding apart, the same gradient: at most one step of its dtype away (softmax - one-hot, ignored rows 0)
        torch.testing.assert_close(ours.grad.float(), reference.grad.float(), rtol=2**-7 if dtype == torch.bfloat16 else 1e-5, atol=1e-9)
        assert not ours.grad[::3].any()
    # No gradient wanted (evaluation): the loss alone.
    with torch.no_grad():
        assert torch.allclose(chunked_cross_entropy(logits, targets), expected, rtol=1e-6, atol=0)


def test_the_default_loss_chunks_large_bf16_and_fp32_logits_and_leaves_the_rest_to_torch():
    targets = torch.randint(0, 9000, (2, 65))
    chunked = {
        (torch.bfloat16, 65): True,  # more than one chunk (2 MB as fp32)
        (torch.bfloat16, 10): False,  # one chunk: F.cross_entropy is as fast
        (torch.float32, 65): False,  # fp32 pays from 8 chunks
        (torch.float32, 512): True,
        (torch.float16, 512): False,  # its stored gradient could underflow
    }
    for (dtype, seq), expected in chunked.items():
        logits = torch.randn(2, seq, 9000).to(dtype).requires_grad_()
        loss = causal_lm_loss(logits, torch.randint(0, 9000, (2, seq)))
        assert ("Chunked" in type(loss.grad_fn).__name__) is expected, (dtype, seq)
    # Byte targets (a byte-level corpus), as F.cross_entropy takes them.
    logits, byte_targets = torch.randn(3000, 256).bfloat16(), torch.randint(0, 256, (3000,), dtype=torch.uint8)
    assert chunked_pays(logits, byte_targets)
    assert torch.allclose(causal_lm_loss(logits, byte_targets), F.cross_entropy(logits.float(), byte_targets), rtol=1e-6, atol=0)
    # A compiled loss (inductor fuses F.cross_entropy itself) and a GPU's keep torch's.
    logits = torch.randn(2, 65, 9000).bfloat16().requires_grad_()
    assert torch.compile(causal_lm_loss, backend="eager")(logits, targets).grad_fn.name() == "NllLossBackward0"
    assert not chunked_pays(logits.detach().to("meta"), targets)


def test_chunked_cross_entropy_matches_torch_where_every_target_is_ignored():
    logits = torch.randn(4, 10).bfloat16().requires_grad_()
    ignored = torch.full((4,), -100)
    loss = chunked_cross_entropy(logits, ignored)
    loss.backward()
    assert loss.isnan() and F.cross_entropy(logits.detach().float(), ignored).isnan()
    assert not logits.grad.any()  # as torch's: no gradient, not NaN
