"""Write small random-weight checkpoints of real architectures, in HF format.

The output is a normal model directory (config.json, safetensors, tokenizer.json,
tokenizer_config.json with a chat template, generation_config.json, README.md) that both
this engine and HF `transformers` load. Weights are random: for tests and benchmarks only.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

_CORPUS = """\
The quick brown fox jumps over the lazy dog while the cat sleeps in the warm sun.
A gateway sends each request to the model that fits the task and the budget best.
Tokens flow in, tokens flow out; the cache keeps what the next request will need again.
She sold sea shells by the sea shore, and the shells she sold were surely sea shells.
In the beginning the engine read the prompt, wrote its keys and values, and began to speak.
How are you today? I am fine, thank you. What would you like to know about the weather?
The weather is cold in the north and warm in the south; it rains on Mondays and Fridays.
Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000 3.14159 2.71828 42 and 1,234,567.
Code: def add(a, b): return a + b  # print("hello, world") {"key": [1, 2, 3]} x = y * 2;
Café, naïve, façade, jalapeño, über, smörgåsbord, résumé, coöperate, déjà vu.
Emoji and scripts: 🙂 🚀 ✨ 日本語のテキスト 中文文本 한국어 Ελληνικά русский текст עברית العربية.
Once upon a time there was a little engine that could batch requests without waiting.
Every block holds sixteen tokens; a full block can be shared by every request that needs it.
Please summarise the following text in one sentence, then list three key points.
You are a helpful assistant. Answer briefly and accurately, and say when you do not know.
"""

_FAMILIES: dict[str, dict[str, Any]] = {
    "llama": {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "rope_theta": 500000.0,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 4.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 512,
        },
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
    },
    "mistral": {
        "architectures": ["MistralForCausalLM"],
        "model_type": "mistral",
        "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
        "sliding_window": None,
    },
    "qwen2": {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": True,
        "use_sliding_window": False,
        "sliding_window": None,
    },
    "qwen3": {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": True,
        "attention_bias": False,
        "use_sliding_window": False,
        "sliding_window": None,
    },
}

_LLAMA3_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{%- if message['role'] not in ['system', 'user', 'assistant', 'tool'] %}"
    "{{- raise_exception('unknown role: ' + message['role']) }}"
    "{%- endif %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
    " + message['content'] | trim + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{%- endif %}"
)
# Qwen-style ChatML with tools, written for these checkpoints (the real Qwen3 template's
# layout: functions listed in the system turn inside <tools>, calls as <tool_call> JSON, tool
# results inside <tool_response> in a user turn); no tools and no tool turns: plain ChatML.
_QWEN_TEMPLATE = "".join(
    [
        r"{%- if tools %}",
        r"{{- '<|im_start|>system\n' }}",
        r"{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] + '\n\n' }}"
        r"{%- endif %}",
        r"{{- '# Tools\n\nYou may call one or more functions to help with the request.\n\n'"
        r" + 'The functions, one JSON signature a line, inside <tools></tools> XML tags:\n"
        r"<tools>' }}",
        r"{%- for tool in tools %}{{- '\n' + (tool | tojson) }}{%- endfor %}",
        r"{{- '\n</tools>\n\nTo call a function, answer with a JSON object of its name and "
        r"arguments inside <tool_call></tool_call> XML tags:\n<tool_call>\n"
        r"{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>"
        r"<|im_end|>\n' }}",
        r"{%- endif %}",
        r"{%- for message in messages %}",
        r"{%- set role = message['role'] %}",
        r"{%- if role not in ['system', 'user', 'assistant', 'tool'] %}",
        r"{{- raise_exception('unknown role: ' + role) }}",
        r"{%- endif %}",
        r"{%- if role == 'system' and tools and loop.first %}",
        r"{%- elif role == 'tool' %}",
        r"{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}"
        r"{{- '<|im_start|>user' }}{%- endif %}",
        r"{{- '\n<tool_response>\n' + message['content'] + '\n</tool_response>' }}",
        r"{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}"
        r"{{- '<|im_end|>\n' }}{%- endif %}",
        r"{%- elif role == 'assistant' and message['tool_calls'] %}",
        r"{{- '<|im_start|>assistant\n' + (message['content'] or '') }}",
        r"{%- for call in message['tool_calls'] %}",
        r"{%- set fn = call['function'] if call['function'] is defined else call %}",
        r"{%- if not loop.first or message['content'] %}{{- '\n' }}{%- endif %}",
        r"{%- set args = fn['arguments'] if fn['arguments'] is string"
        r" else fn['arguments'] | tojson %}",
        r"{{- '<tool_call>\n{\"name\": \"' + fn['name'] + '\", \"arguments\": ' + args"
        r" + '}\n</tool_call>' }}",
        r"{%- endfor %}",
        r"{{- '<|im_end|>\n' }}",
        r"{%- else %}",
        r"{{- '<|im_start|>' + role + '\n' + message['content'] + '<|im_end|>\n' }}",
        r"{%- endif %}",
        r"{%- endfor %}",
        r"{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}",
    ]
)
_MISTRAL_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'user' %}{{- '[INST] ' + message['content'] + ' [/INST]' }}"
    "{%- elif message['role'] == 'assistant' %}{{- message['content'] + eos_token }}"
    "{%- else %}{{- raise_exception('only user and assistant roles are supported') }}"
    "{%- endif %}"
    "{%- endfor %}"
)

# family -> (special tokens, bos, eos for chat, all eos ids' tokens, chat template)
_SPECIALS: dict[str, tuple[list[str], str | None, str, list[str], str]] = {
    "llama": (
        [
            "<|begin_of_text|>",
            "<|end_of_text|>",
            "<|start_header_id|>",
            "<|end_header_id|>",
            "<|eot_id|>",
        ],
        "<|begin_of_text|>",
        "<|eot_id|>",
        ["<|end_of_text|>", "<|eot_id|>"],
        _LLAMA3_TEMPLATE,
    ),
    "mistral": (
        ["<unk>", "<s>", "</s>", "[INST]", "[/INST]"],
        "<s>",
        "</s>",
        ["</s>"],
        _MISTRAL_TEMPLATE,
    ),
    "qwen": (
        ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        None,
        "<|im_end|>",
        ["<|im_end|>", "<|endoftext|>"],
        _QWEN_TEMPLATE,
    ),
}


def _train_tokenizer(specials: list[str], bos: str | None, vocab_size: int) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_CORPUS.splitlines(), trainer)
    if bos is not None:
        bos_id = tokenizer.token_to_id(bos)
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A $B", special_tokens=[(bos, bos_id)]
        )
    return tokenizer


def _random_weights(config: dict[str, Any], seed: int, init_std: float) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)

    def normal(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) * init_std

    def norm_weight(size: int) -> torch.Tensor:
        return 1.0 + 0.1 * torch.randn(size, generator=gen)

    hidden, inter = config["hidden_size"], config["intermediate_size"]
    heads, kv_heads, head_dim = (
        config["num_attention_heads"],
        config["num_key_value_heads"],
        config["head_dim"],
    )
    qkv_bias = config["model_type"] == "qwen2" or config.get("attention_bias", False)
    weights = {"model.embed_tokens.weight": normal(config["vocab_size"], hidden)}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        weights[p + "self_attn.q_proj.weight"] = normal(heads * head_dim, hidden)
        weights[p + "self_attn.k_proj.weight"] = normal(kv_heads * head_dim, hidden)
        weights[p + "self_attn.v_proj.weight"] = normal(kv_heads * head_dim, hidden)
        weights[p + "self_attn.o_proj.weight"] = normal(hidden, heads * head_dim)
        if qkv_bias:
            weights[p + "self_attn.q_proj.bias"] = normal(heads * head_dim)
            weights[p + "self_attn.k_proj.bias"] = normal(kv_heads * head_dim)
            weights[p + "self_attn.v_proj.bias"] = normal(kv_heads * head_dim)
        if config["model_type"] == "qwen3":
            weights[p + "self_attn.q_norm.weight"] = norm_weight(head_dim)
            weights[p + "self_attn.k_norm.weight"] = norm_weight(head_dim)
        weights[p + "mlp.gate_proj.weight"] = normal(inter, hidden)
        weights[p + "mlp.up_proj.weight"] = normal(inter, hidden)
        weights[p + "mlp.down_proj.weight"] = normal(hidden, inter)
        weights[p + "input_layernorm.weight"] = norm_weight(hidden)
        weights[p + "post_attention_layernorm.weight"] = norm_weight(hidden)
    weights["model.norm.weight"] = norm_weight(hidden)
    if not config["tie_word_embeddings"]:
        weights["lm_head.weight"] = normal(config["vocab_size"], hidden)
    return weights


def _save_weights(path: Path, weights: dict[str, torch.Tensor], shards: int) -> None:
    from safetensors.torch import save_file

    metadata = {"format": "pt"}
    if shards <= 1:
        save_file(weights, str(path / "model.safetensors"), metadata=metadata)
        return
    names = list(weights)
    per_shard = -(-len(names) // shards)
    weight_map: dict[str, str] = {}
    for index in range(shards):
        file_name = f"model-{index + 1:05d}-of-{shards:05d}.safetensors"
        part = {name: weights[name] for name in names[index * per_shard : (index + 1) * per_shard]}
        save_file(part, str(path / file_name), metadata=metadata)
        weight_map.update(dict.fromkeys(part, file_name))
    total = sum(t.numel() * t.element_size() for t in weights.values())
    index_doc = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (path / "model.safetensors.index.json").write_text(json.dumps(index_doc, indent=2))


_MODEL_CARD = """\
---
license: apache-2.0
tags: [random-weights, smoke-test]
---
# {name}

A tiny **random-weight** `{arch}` checkpoint written by `tests/support/tiny_checkpoint.py` (seed {seed}).
It has the real architecture and file layout of its family, and a real byte-level BPE
tokenizer and chat template (Qwen's renders `tools`), but its weights are random: its output is gibberish.
Use it for smoke tests, benchmarks of the serving path and format checks — never for answers.

hidden_size={hidden}, layers={layers}, heads={heads}, kv_heads={kv_heads}, vocab={vocab}
"""


def write_tiny_checkpoint(
    path: str | Path,
    arch: str = "llama",
    seed: int = 0,
    *,
    shards: int = 1,
    init_std: float = 0.1,
    vocab_size: int = 512,
    dtype: str = "float32",
    **config_overrides: Any,
) -> Path:
    """Write the checkpoint into `path` (created) and return it.

    `config_overrides` go into config.json (hidden_size, num_hidden_layers,
    num_attention_heads, num_key_value_heads, intermediate_size, head_dim, ...).
    """
    if arch not in _FAMILIES:
        raise ValueError(f"unknown arch {arch!r}; choose one of {', '.join(_FAMILIES)}")
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    special_family = "qwen" if arch.startswith("qwen") else arch
    specials, bos, chat_eos, eos_tokens, template = _SPECIALS[special_family]
    tokenizer = _train_tokenizer(specials, bos, vocab_size)
    tokenizer.save(str(out / "tokenizer.json"))
    eos_ids = [tokenizer.token_to_id(t) for t in eos_tokens]
    bos_id = tokenizer.token_to_id(bos) if bos else None

    config: dict[str, Any] = {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 2048,
        "hidden_act": "silu",
        "initializer_range": init_std,
        "use_cache": True,
        "torch_dtype": dtype,
        **_FAMILIES[arch],
        **config_overrides,
    }
    config["vocab_size"] = tokenizer.get_vocab_size(with_added_tokens=True)
    config.setdefault("head_dim", config["hidden_size"] // config["num_attention_heads"])
    config["bos_token_id"] = bos_id
    config["eos_token_id"] = eos_ids[0]
    (out / "config.json").write_text(json.dumps(config, indent=2))

    weights = _random_weights(config, seed, init_std)
    torch_dtype = getattr(torch, dtype)
    _save_weights(out, {k: v.to(torch_dtype).contiguous() for k, v in weights.items()}, shards)

    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": bos,
        "eos_token": chat_eos,
        "pad_token": eos_tokens[-1],
        "model_max_length": config["max_position_embeddings"],
        "clean_up_tokenization_spaces": False,
        "chat_template": template,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2))
    generation_config = {"bos_token_id": bos_id, "eos_token_id": eos_ids, "do_sample": False}
    (out / "generation_config.json").write_text(json.dumps(generation_config, indent=2))
    (out / "README.md").write_text(
        _MODEL_CARD.format(
            name=out.name,
            arch=config["architectures"][0],
            seed=seed,
            hidden=config["hidden_size"],
            layers=config["num_hidden_layers"],
            heads=config["num_attention_heads"],
            kv_heads=config["num_key_value_heads"],
            vocab=config["vocab_size"],
        )
    )
    return out
