"""Builder of the tiny offline target LM; `build.build_tiny_target` is the entry point.

One job per module: corpus (what text), tokenizer (BPE + chat template), chat_data (JSONL rows),
presets (model/recipe sizes), train (loop), evaluation (held-out loss, sample), artifact (recipe,
provenance, atomic publish), build (the pipeline).
"""
