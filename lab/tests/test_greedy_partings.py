"""greedy_partings.py re-scores a saved gate report's greedy partings on CPU: it rebuilds
the gate's prompts and finds exactly the step where a run left the target's float64 argmax."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from lab.analysis.greedy_partings import main
from lab.gpu.vllm_vs_engine import prompts_of


def test_rescoring_finds_the_planted_parting(target, tmp_path):
    heldout = str(target / "data" / "heldout.jsonl")
    prompts = prompts_of(str(target), 2, {"chat": heldout})
    m = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float64).eval()
    greedy = []
    for p in prompts:
        g = m.generate(torch.tensor([p]), max_new_tokens=4, do_sample=False)
        greedy.append(g[0, len(p) :].tolist())
    with torch.no_grad():
        logits = m(torch.tensor([prompts[1] + greedy[1][:2]])).logits[0, -1]
    engine = [list(greedy[0]), greedy[1][:2] + [int(logits.topk(2).indices[1])]]
    report = {
        "num_prompts": 2,
        "engine": {"0.0": {"outputs": engine}},
        "hf_greedy": greedy,
        "vllm": {"0.0": {"outputs": greedy}, "target_only_greedy": greedy},
    }
    path = tmp_path / "gate.json"
    path.write_text(json.dumps(report))
    out = tmp_path / "partings.json"
    args = [str(path), "--target", str(target), "--num-prompts", "2"]
    assert main([*args, "--prompts", f"chat={heldout}", "--out", str(out)]) == 0
    got = json.loads(out.read_text())
    assert got["vllm_greedy_partings"] == []
    (p,) = got["engine_greedy_partings"]
    assert (p["prompt"], p["step"], p["fp64_argmax"], p["base_deficit"]) == (1, 2, greedy[1][2], 0)
    assert p["spec_deficit"] == pytest.approx(float(logits.max() - logits.topk(2).values[1]))
    # Prompts that do not rebuild the report's are refused, not re-scored against the wrong text.
    with pytest.raises(SystemExit, match="1 prompts rebuilt"):
        main([str(path), "--target", str(target), "--num-prompts", "1"])
