"""A tiny random-weight Qwen3 model built offline, so the real-token path runs anywhere.

Tests, the README's main command and `fleet bench` on a CPU need a model that goes through
exactly the files a production model has (config.json, safetensors weights, tokenizer.json,
a chat template, generation_config.json) without a hub download. The weights are random,
so the text is noise, but the token ids, templates, eos handling and sampling are real.

The tokenizer is a byte-level BPE trained on Python standard-library source, which every
Python install carries. For a given seed, Python build and torch version the output
directory is byte-for-byte the same, so the job manifest's model revision is too; another
Python build (3.11.2 against 3.11.7) may tokenize differently, so tests size prompts by
the tokenizer, never by a word count.
"""

from __future__ import annotations

import importlib
import inspect
import json
from pathlib import Path

#: Pure-Python stdlib modules whose source trains the tokenizer (stable within a Python build).
CORPUS_MODULES = (
    "argparse", "csv", "dataclasses", "difflib", "enum", "functools", "heapq", "json",
    "pathlib", "pprint", "random", "statistics", "string", "textwrap", "typing",
)  # fmt: skip
VOCAB_SIZE = 1024
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
THINK_TOKENS = ("<think>", "</think>")
CONTEXT_LENGTH = 2048
#: Wider than the 0.02 default so that greedy decoding has clear winners, not near-ties.
INIT_RANGE = 0.2

#: Qwen-style ChatML. With thinking on the generation prompt opens the think block (as in
#: Qwen 3.5/3.6), with it off it emits an empty one, as the Qwen3 templates do.
CHAT_TEMPLATE = """\
{%- for message in messages -%}
<|im_start|>{{ message['role'] }}
{% if message['content'] is string -%}
{{ message['content'] }}
{%- elif message['content'] is not none -%}
{%- for part in message['content'] if part['type'] == 'text' -%}{{ part['text'] }}{%- endfor -%}
{%- endif -%}
<|im_end|>
{% endfor -%}
{%- if add_generation_prompt -%}
<|im_start|>assistant
{% if enable_thinking is defined and enable_thinking is false -%}
<think>

</think>

{% else -%}
<think>
{% endif -%}
{%- endif -%}
"""


def corpus_text() -> str:
    """Training text for the tokenizer: stdlib source, docstrings where source is missing."""
    parts = []
    for name in CORPUS_MODULES:
        module = importlib.import_module(name)
        try:
            parts.append(inspect.getsource(module))
        except (OSError, TypeError):
            parts.append(module.__doc__ or "")
    return "\n".join(parts)


def build_tokenizer(vocab_size: int = VOCAB_SIZE):
    """A byte-level BPE with Qwen's special tokens, wrapped as a PreTrainedTokenizerFast."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus_text().splitlines(keepends=True), trainer=trainer)
    # Qwen marks the think tags as added but not special, so skip_special_tokens keeps them.
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in THINK_TOKENS])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=CHAT_TEMPLATE,
        model_max_length=CONTEXT_LENGTH,
        clean_up_tokenization_spaces=False,
    )


def build_tiny_model(out_dir: Path, seed: int = 0) -> Path:
    """Write a tiny Qwen3ForCausalLM with tokenizer, template and generation config; no network."""
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    im_end, eot = tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    config = Qwen3Config(
        vocab_size=-(-len(tokenizer) // 64) * 64,  # padded like real checkpoints
        # head_dim 64 keeps SGLang's attention kernels usable for the GPU smoke test.
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        max_position_embeddings=CONTEXT_LENGTH,
        initializer_range=INIT_RANGE,
        tie_word_embeddings=True,
        bos_token_id=eot,
        eos_token_id=im_end,
        pad_token_id=eot,
    )
    config.architectures = ["Qwen3ForCausalLM"]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config).to(torch.float32).eval()
    model.generation_config = GenerationConfig(
        do_sample=True,
        temperature=1.0,
        top_k=20,
        top_p=0.95,
        bos_token_id=eot,
        eos_token_id=[im_end, eot],
        pad_token_id=eot,
    )
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    _pin_json(out_dir)
    return out_dir


def _pin_json(out_dir: Path) -> None:
    """Rewrite JSON files with sorted keys so the directory's bytes depend only on the seed."""
    for path in out_dir.glob("*.json"):
        data = json.loads(path.read_text())
        if isinstance(data, dict):
            data.pop("transformers_version", None)
            if path.name == "tokenizer_config.json":
                # The v4 and v5 name alike; v5 writes its own backend name otherwise.
                data["tokenizer_class"] = "PreTrainedTokenizerFast"
        path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
