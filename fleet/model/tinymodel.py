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

Random weights alone would never close a think block, so a few are set by hand (`steer`):
two residual channels that no layer writes carry a state (thinking, or answering) from each
token's embedding to the output head, which then favours `</think>` rarely while thinking,
word tokens and `<|im_end|>` while answering, and `<|im_end|>` very rarely while thinking.
With the model's own sampling, rows close their thinking after a few to a few hundred
tokens and then answer in a few dozen words; some end inside the thinking and some run
past a few hundred tokens, as a real thinking model's rows do.

`--loop` adds the failure the repetition stop is for (`loop_greedily`): under greedy
decoding the rows fall into an exact 3-token cycle within a few tokens and think in it until
max_tokens; under the sampled defaults the cycle is one choice among twenty and breaks.
"""

from __future__ import annotations

import importlib
import inspect
import json
import re
from pathlib import Path
from typing import Any

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
#: Logits (at the usual scale: the top one near 8, the 20th near 5) that `steer` gives its
#: tokens. `</think>` and `<|im_end|>` while thinking sit just under the top-20 cut, so they
#: are sampled now and then; answering, word tokens gain ANSWER_BOOST over the rest.
CLOSE_THINKING, END_THINKING = 4.3, 3.7
END_ANSWERING, ANSWER_BOOST = 11.5, 8.0
#: `--loop`: the cycle's tokens (thinking tokens: no lowercase word), and the logits (usual
#: scale as above) of its entry token everywhere, of a cycle token's successor and of the
#: LOOP_CHOICES - 1 decoys beside it. Entry just over the usual top logit (7.1 at the median
#: while thinking) wins greedy decoding within a token or two; after a cycle token the
#: successor beats the decoys by 1, so greedy always follows it, while sampling (top 20)
#: follows it about one time in eight.
LOOP_TOKENS = ("\u0120True", "\u0120False", ".")
LOOP_ENTRY, LOOP_NEXT, LOOP_CHOICES = 7.5, 14.0, 20
#: Answer tokens: a space and a lowercase word, so answers read as words, reasoning as noise.
ANSWER_TOKEN = re.compile(r"\u0120[a-z]{2,}")

#: The Qwen3.6 chat format (ChatML with a think block). The generation prompt opens the think
#: block (`<think>\n`), or with enable_thinking false emits an empty one. An assistant turn
#: after the last user turn is rendered `<think>\n{reasoning}\n</think>\n\n{answer}`, from its
#: `reasoning_content` (or from a `</think>` inside its content); earlier assistant turns keep
#: only their answer unless preserve_thinking is true. Reasoning and answer are trimmed, as
#: Qwen's templates do. This is the text SpecForge's `qwen3.5` template finds its spans in.
CHAT_TEMPLATE = """\
{%- macro text(content) -%}
{%- if content is string -%}{{ content }}
{%- elif content is not none -%}
{%- for part in content if part['type'] == 'text' -%}{{ part['text'] }}{%- endfor -%}
{%- endif -%}
{%- endmacro -%}
{%- set ns = namespace(last_query=-1) -%}
{%- for message in messages -%}
{%- if message['role'] == 'user' -%}{%- set ns.last_query = loop.index0 -%}{%- endif -%}
{%- endfor -%}
{%- for message in messages -%}
{%- if message['role'] == 'assistant' -%}
{%- set answer = text(message['content']) | string -%}
{%- set reasoning = '' -%}
{%- if message['reasoning_content'] is string -%}
{%- set reasoning = message['reasoning_content'] -%}
{%- elif '</think>' in answer -%}
{%- set reasoning = answer.split('</think>')[0].split('<think>')[-1] -%}
{%- set answer = answer.split('</think>')[-1] -%}
{%- endif -%}
{%- if (preserve_thinking is defined and preserve_thinking is true) or loop.index0 > ns.last_query -%}
<|im_start|>assistant
<think>
{{ reasoning | trim }}
</think>

{{ answer | trim }}
{%- else -%}
<|im_start|>assistant
{{ answer | trim }}
{%- endif -%}
<|im_end|>
{% else -%}
<|im_start|>{{ message['role'] }}
{{ text(message['content']) }}<|im_end|>
{% endif -%}
{%- endfor -%}
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


#: the sampling defaults of the tiny model's generation_config.json (a job of it samples so unless told)
SAMPLING = {"do_sample": True, "temperature": 1.0, "top_k": 20, "top_p": 0.95}


def build_tiny_model(out_dir: Path, seed: int = 0, loop: bool = False) -> Path:
    """Write a tiny Qwen3ForCausalLM with tokenizer, template and generation config; no network.
    `loop`: greedy rows fall into an exact 3-token cycle (`loop_greedily`)."""
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
        # untied, so the output head can be steered apart from the embeddings
        tie_word_embeddings=False,
        bos_token_id=eot,
        eos_token_id=im_end,
        pad_token_id=eot,
    )
    config.architectures = ["Qwen3ForCausalLM"]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config).to(torch.float32).eval()
    steer(model, tokenizer)
    if loop:
        loop_greedily(model, tokenizer)
    model.generation_config = GenerationConfig(
        **SAMPLING,
        bos_token_id=eot,
        eos_token_id=[im_end, eot],
        pad_token_id=eot,
    )
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    _pin_json(out_dir)
    return out_dir


def steer(model: Any, tokenizer: Any) -> None:
    """Give a random-weight causal LM the shape of a thinking model's rows (module docstring).

    Channel S holds +A on answer tokens and `</think>`, -A on every other token; channel B
    holds +A everywhere (a bias). Every linear layer inside the decoder that writes the
    residual stream gets zero rows there, so both reach the final norm as embedded; their
    scale after it is measured on one prompt, and the head's weights are set in logit units.
    """
    import torch

    hidden = model.config.hidden_size
    s, b = hidden - 2, hidden - 1
    ids = tokenizer.convert_tokens_to_ids
    close, end = ids(THINK_TOKENS[1]), ids("<|im_end|>")
    banned = [ids(t) for t in (*SPECIAL_TOKENS, THINK_TOKENS[0]) if t != "<|im_end|>"] + unprintable(tokenizer)
    words = [i for t, i in tokenizer.get_vocab().items() if ANSWER_TOKEN.fullmatch(t)]
    embed, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    with torch.no_grad():
        for module in model.model.layers.modules():
            if isinstance(module, torch.nn.Linear) and module.out_features == hidden:
                module.weight[[s, b], :] = 0
        embed[:, s] = -INIT_RANGE
        embed[[*words, close], s] = INIT_RANGE
        embed[:, b] = INIT_RANGE
        scale = _channel_scale(model, tokenizer, b)
        head[:, [s, b]] = 0
        head[words, s] = ANSWER_BOOST / scale
        for token, thinking, answering in ((close, CLOSE_THINKING, -30.0), (end, END_THINKING, END_ANSWERING)):
            head[token, :] = 0
            head[token, b] = (answering + thinking) / 2 / scale
            head[token, s] = (answering - thinking) / 2 / scale
        head[banned, :] = 0
        head[banned, b] = -30.0 / scale


def loop_greedily(model: Any, tokenizer: Any) -> None:
    """Make greedy decoding loop on LOOP_TOKENS while sampling does not (constants above).

    One more residual channel per cycle token, written by nothing inside the decoder (as
    `steer`'s), holds +A on that token's embedding and 0 on every other. The head rows of the
    cycle tokens and of the decoys lose their random weights: the entry token gets LOOP_ENTRY
    from steer's bias channel, and each cycle token's channel gives its successor LOOP_NEXT
    and the decoys LOOP_NEXT - 1, so its next token is the successor under greedy decoding.
    """
    import torch

    hidden = model.config.hidden_size
    bias = hidden - 1
    cycle = tokenizer.convert_tokens_to_ids(list(LOOP_TOKENS))
    channels = [hidden - 2 - len(cycle) + i for i in range(len(cycle))]  # beside steer's two
    skip = {*cycle, *tokenizer.convert_tokens_to_ids([*SPECIAL_TOKENS, *THINK_TOKENS]), *unprintable(tokenizer)}
    skip |= {i for t, i in tokenizer.get_vocab().items() if ANSWER_TOKEN.fullmatch(t)}  # a decoy keeps it thinking
    decoys = [i for i in range(len(tokenizer)) if i not in skip][: LOOP_CHOICES - 1]
    embed, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    with torch.no_grad():
        for module in model.model.layers.modules():
            if isinstance(module, torch.nn.Linear) and module.out_features == hidden:
                module.weight[channels, :] = 0
        embed[:, channels] = 0
        embed[cycle, channels] = INIT_RANGE
        scale = _channel_scale(model, tokenizer, bias)
        head[[*cycle, *decoys], :] = 0
        head[cycle[0], bias] = LOOP_ENTRY / scale
        for i, channel in enumerate(channels):
            successor = cycle[(i + 1) % len(cycle)]
            head[successor, channel] = (LOOP_NEXT - (LOOP_ENTRY if successor == cycle[0] else 0)) / scale
            head[decoys, channel] = (LOOP_NEXT - 1) / scale


def unprintable(tokenizer: Any) -> list[int]:
    """Tokens that decode to part of a UTF-8 character or to a control character: text made
    of them prints as replacement marks, which no real model's output is full of."""
    out = []
    for token_id in range(len(tokenizer)):
        text = tokenizer.decode([token_id])
        if "\ufffd" in text or any(ord(c) < 32 and c not in "\n\t" for c in text):
            out.append(token_id)
    return out


def _channel_scale(model: Any, tokenizer: Any, channel: int) -> float:
    """Mean size of `channel` after the final norm, over a rendered prompt's positions;
    refuses a model where some layer still writes the channel (a residual write that is not
    an nn.Linear, such as fused expert weights, needs zeroing too)."""
    import torch

    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the answer?"}], add_generation_prompt=True, tokenize=True,
        return_dict=True,
    )["input_ids"]
    seen: list[tuple[Any, Any]] = []
    hook = model.model.norm.register_forward_hook(lambda _module, args, out: seen.append((args[0], out)))
    try:
        model(torch.tensor([prompt]))
    finally:
        hook.remove()
    before, after = seen[-1]
    if not torch.allclose(before[0, :, channel], torch.full_like(before[0, :, channel], INIT_RANGE), atol=1e-5):
        raise RuntimeError(f"a decoder layer writes residual channel {channel}; steer cannot hold its state there")
    return float(after[0, :, channel].abs().mean())


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
