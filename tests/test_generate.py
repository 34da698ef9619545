"""Generation (`currytrain generate`, currytrain/eval/generate.py): the KV cache gives the full forward's logits
for every family the HF bridge imports, greedy tokens equal transformers' generate on the same weights, sampling
is reproducible by seed, and bad input exits 2 naming the fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")
pytest.importorskip("tokenizers")

from test_hf import CASES, TOKENS, UNCACHED, make_hf_model  # noqa: E402
from tiny_tokenizer import train_tokenizer  # noqa: E402

from currytrain.cli import main  # noqa: E402
from currytrain.eval.generate import Sampling, choose, generate  # noqa: E402
from currytrain.hf import import_hf, load_model  # noqa: E402
from currytrain.model.cache import KVCache  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

NEW_TOKENS = 32
PARITY_FAMILIES = ("LlamaForCausalLM", "Qwen3ForCausalLM", "MixtralForCausalLM")
"""The families whose imports `currytrain generate` runs end to end, text in and text out, against transformers."""


@pytest.fixture(scope="module")
def imports(tmp_path_factory):
    """imports(case, **overrides) -> (transformers model, import folder), each built once per module."""
    root, built = tmp_path_factory.mktemp("imports"), {}

    def get(case: str, tokenizer: Path | None = None, **overrides) -> tuple[torch.nn.Module, Path]:
        key = (case, tokenizer is not None)
        if key not in built:
            reference = make_hf_model(case, **overrides)
            folder = root / f"{case}-{len(built)}"
            reference.save_pretrained(folder / "hf")
            if tokenizer is not None:
                for path in tokenizer.parent.iterdir():
                    (folder / "hf" / path.name).write_bytes(path.read_bytes())
            import_hf(str(folder / "hf"), folder / "imported")
            built[key] = reference, folder / "imported"
        return built[key]

    return get


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> Path:
    return train_tokenizer(tmp_path_factory.mktemp("tokenizer"), vocab_size=320)


@pytest.mark.parametrize("case", [case for case in CASES if CASES[case][2].get("rope_scaling", {}).get("rope_type") not in UNCACHED])
def test_cached_decode_gives_the_full_forwards_logits(case, imports):
    """A prompt of 5 tokens, 5 tokens one at a time, then 6 at once through the cache: the logits of the whole
    sequence's forward (sliding windows, soft-caps, latent attention, local RoPE and MoE routing included)."""
    _, folder = imports(case)
    model = load_model(folder)
    tokens = TOKENS[:1, :16]
    cache = KVCache(16)
    with torch.no_grad():
        expected = model(tokens)
        pieces = [model.decode(tokens[:, :5], cache), *(model.decode(tokens[:, i : i + 1], cache) for i in range(5, 10)), model.decode(tokens[:, 10:], cache)]
    torch.testing.assert_close(torch.cat(pieces, dim=1), expected, atol=2e-5, rtol=0)
    assert cache.length == 16


@pytest.mark.parametrize("case", list(CASES))
def test_greedy_tokens_equal_transformers_generate(case, imports):
    """32 greedy tokens of curryTrain's cached generation equal transformers' cached generate on the same weights
    (the RoPE scalings that depend on the length included: both rotate each new key for the length so far)."""
    reference, folder = imports(case)
    model = load_model(folder)
    prompt = TOKENS[:1, :4]
    with torch.no_grad():
        expected = reference.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS)
    ours = list(generate(model, prompt[0].tolist(), Sampling(max_new_tokens=NEW_TOKENS)))
    assert len(ours) == NEW_TOKENS
    assert ours == expected[0, 4:].tolist()


@pytest.mark.parametrize("case", PARITY_FAMILIES)
def test_currytrain_generate_equals_transformers(case, imports, tokenizer, capsys):
    """`currytrain generate IMPORT --prompt ... --greedy`: the import's own tokenizer reads the prompt, and the 32
    tokens printed equal transformers' generate from the same ids, stopping at the same EOS."""
    reference, folder = imports(case, tokenizer, vocab_size=320, pad_token_id=None, bos_token_id=None, eos_token_id=0)
    prompt = "def main(argv):\n    "
    code = main(["generate", str(folder), "--prompt", prompt, "--greedy", "--max-new-tokens", str(NEW_TOKENS), "--json"])
    assert code == 0
    record = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    from tokenizers import Tokenizer

    ids = Tokenizer.from_file(str(tokenizer)).encode(prompt, add_special_tokens=False).ids
    assert record["prompt_tokens"] == len(ids)
    inputs = torch.tensor([ids])
    with torch.no_grad():
        expected = reference.generate(inputs, attention_mask=torch.ones_like(inputs), do_sample=False, max_new_tokens=NEW_TOKENS)[0, len(ids) :].tolist()
    assert record["tokens"] == expected
    assert record["stopped"] == ("stop_token" if expected[-1] == 0 else "max_new_tokens")
    assert record["text"] == Tokenizer.from_file(str(tokenizer)).decode([t for t in expected if t != 0], skip_special_tokens=False)


def test_generation_stops_at_an_eos_token_as_transformers_does(imports):
    """With the 6th greedy token named EOS, both generations end with it."""
    reference, folder = imports("LlamaForCausalLM")
    model = load_model(folder)
    prompt = TOKENS[:1, :4]
    free = list(generate(model, prompt[0].tolist(), Sampling(max_new_tokens=12)))
    eos = free[5]
    stopped = list(generate(model, prompt[0].tolist(), Sampling(max_new_tokens=12), stop_ids=frozenset({eos})))
    assert stopped == free[: free.index(eos) + 1]
    with torch.no_grad():
        expected = reference.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False, max_new_tokens=12, eos_token_id=eos, pad_token_id=eos)
    assert expected[0, 4:].tolist()[: len(stopped)] == stopped


def test_sampling_is_reproducible_by_seed_and_filters_as_asked():
    """The same seed draws the same tokens; top_k=1 and a tiny top_p are greedy; top_k never draws outside the k."""
    torch.manual_seed(0)
    logits = torch.randn(4, 50)
    tempered = Sampling(temperature=1.0, seed=3)
    draw = lambda s, seed: choose(logits, s, torch.Generator().manual_seed(seed))  # noqa: E731
    assert torch.equal(draw(tempered, 3), draw(tempered, 3))
    assert not all(torch.equal(draw(tempered, 3), draw(tempered, seed)) for seed in range(4, 9))
    greedy = logits.argmax(-1)
    assert torch.equal(draw(Sampling(temperature=1.0, top_k=1), 0), greedy)
    assert torch.equal(draw(Sampling(temperature=1.0, top_p=1e-6), 0), greedy)
    allowed = logits.topk(5, dim=-1).indices
    for seed in range(20):
        picked = draw(Sampling(temperature=2.0, top_k=5), seed)
        assert (allowed == picked[:, None]).any(-1).all()
    # top_p keeps the smallest set of most likely tokens holding p of the mass
    probs = logits.softmax(-1)
    ordered, order = probs.sort(-1, descending=True)
    needed = (ordered.cumsum(-1) < 0.5).sum(-1) + 1
    for seed in range(20):
        picked = draw(Sampling(temperature=1.0, top_p=0.5), seed)
        rank = (order == picked[:, None]).float().argmax(-1)
        assert (rank < needed).all()


def test_a_model_without_a_cache_generates_by_recomputing_and_says_so_once(caplog):
    """A plain module (no decode) gives the tokens the full forward's argmax gives, with one warning."""

    class Plain(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(20, 8)
            self.out = torch.nn.Linear(8, 20)

        def forward(self, tokens):
            return self.out(self.embed(tokens).cumsum(1))

    torch.manual_seed(0)
    model = Plain()
    with caplog.at_level("WARNING"):
        first = list(generate(model, [1, 2], Sampling(max_new_tokens=6)))
        list(generate(model, [3], Sampling(max_new_tokens=2)))
    tokens = torch.tensor([[1, 2]])
    with torch.no_grad():
        for _ in range(6):
            tokens = torch.cat([tokens, model(tokens)[:, -1:].argmax(-1)], 1)
    assert first == tokens[0, 2:].tolist()
    assert sum("has no decode" in r.message for r in caplog.records) == 1


def test_bytes_run_generates_streamed_text_and_stops_at_its_context(tmp_path, run_launch, capsys):
    """A trained byte-level run: its text streams as it is generated (the JSON record holds the same text), the
    run folder and its checkpoint folder give the same tokens, and the context (model.max_seq_len) ends it."""
    run = tmp_path / "run"
    assert run_launch(f"hydra.run.dir={run}", "logger=[jsonl]").returncode == 0
    code = main(["generate", str(run), "--prompt", "def ", "--greedy", "--max-new-tokens", "8"])
    streamed = capsys.readouterr().out
    assert code == 0 and streamed.startswith("def ")
    code = main(["generate", str(run / "checkpoints" / "step_6"), "--prompt", "def ", "--greedy", "--max-new-tokens", "8", "--json"])
    record = json.loads(capsys.readouterr().out)
    assert streamed == "def " + record["text"] + "\n" and len(record["tokens"]) == 8
    code = main(["generate", str(run), "--prompt", "x" * 20, "--max-new-tokens", "40", "--json", "--seed", "1"])
    record = json.loads(capsys.readouterr().out)
    assert code == 0 and len(record["tokens"]) == 32 - 20 and record["stopped"] == "context"


def test_bad_input_exits_2_naming_the_fix(tmp_path, run_launch, capsys, imports):
    run = tmp_path / "run"
    assert run_launch(f"hydra.run.dir={run}", "logger=[jsonl]").returncode == 0
    _, imported = imports("LlamaForCausalLM")
    cases = {
        "too long": (["generate", str(run), "--prompt", "x" * 40], "the prompt has 40 tokens and the model's context is 32"),
        "no tokenizer": (["generate", str(imported), "--prompt", "hi"], "without hf/tokenizer.json: pass --tokenizer"),
        "no folder": (["generate", str(tmp_path / "nope"), "--prompt", "hi"], "does not exist"),
        "not a run": (["generate", str(tmp_path), "--prompt", "hi"], "has no complete checkpoint"),
        "top-p": (["generate", str(run), "--prompt", "hi", "--top-p", "0"], "--top-p=0.0"),
        "no prompt": (["generate", str(run)], "no prompt: pass --prompt"),
        "prompts file": (["generate", str(run), "--prompts-file", str(tmp_path / "missing.txt")], "--prompts-file"),
    }
    for what, (args, message) in cases.items():
        capsys.readouterr()
        code = main(args)
        err = capsys.readouterr().err
        assert code == 2 and message in err and err.startswith("curryTrain: "), (what, err)
