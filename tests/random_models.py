"""Random Qwen3 models with a locally trained tokenizer, and LoRA adapters on them: what the
engine tests load (nothing is downloaded)."""

from __future__ import annotations

import random
from pathlib import Path

LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def build_random_test_model(path: Path, hidden_size: int = 128) -> Path:
    """Build a tiny random-init Qwen3 model with a locally trained byte-level BPE tokenizer.

    Vocabulary ~1000 with ``<|endoftext|>`` as eos and pad; 2 layers, 4 heads of dim 32, 2 KV
    heads, tied embeddings, float32. A large init scale keeps the logits peaked, so greedy
    decoding has no near-ties that batch-size-dependent rounding could flip.
    """
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = ["".join(rng.choice(letters) for _ in range(rng.randint(2, 7))) for _ in range(3000)]
    words += ["[0]", "[1]", "[4]", "[8]", "X", "O", "move", "board", "player", "pass", "bet"]
    lines = [" ".join(rng.choice(words) for _ in range(rng.randint(4, 16))) for _ in range(4000)]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=1000,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(lines, trainer)
    hf_tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, eos_token="<|endoftext|>", pad_token="<|endoftext|>"
    )
    hf_tokenizer.save_pretrained(path)

    torch.manual_seed(0)
    eos = hf_tokenizer.eos_token_id
    config = Qwen3Config(
        vocab_size=len(hf_tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        initializer_range=0.2,
        eos_token_id=eos,
        pad_token_id=eos,
        bos_token_id=eos,
    )
    Qwen3ForCausalLM(config).to(torch.float32).save_pretrained(path)
    return path


def build_lora_adapters(model_dir: Path, out_dirs: list[Path], rank: int = 8) -> list[Path]:
    """Save one PEFT LoRA adapter per directory, each with different random (non-zero) B weights.

    PEFT initializes B to zero (a no-op adapter), so B is re-drawn here.
    """
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    config = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=LORA_TARGETS)
    model = get_peft_model(base, config)
    for seed, out in enumerate(out_dirs):
        torch.manual_seed(seed)
        with torch.no_grad():
            for name, param in model.named_parameters():
                if "lora_A" in name:
                    torch.nn.init.normal_(param, std=0.2)
                elif "lora_B" in name:
                    torch.nn.init.normal_(param, std=0.5)
        model.save_pretrained(out)
    return out_dirs
