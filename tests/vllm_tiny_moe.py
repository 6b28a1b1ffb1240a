"""Write a tiny random-weight Qwen3-MoE checkpoint with its own tokenizer, for the real vLLM tests.

Run with the python of the vLLM venv (it has transformers):  python vllm_tiny_moe.py OUT_DIR
Nothing is downloaded: a byte-level BPE is trained on CPython's own stdlib sources. Shapes follow
research/feasibility-vllm-cpu.md §2 (hidden 256, 2 layers, 8 experts top-2, vocab 2048, bf16).
"""
from __future__ import annotations

import sys
import sysconfig
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen3MoeConfig, Qwen3MoeForCausalLM

CHAT = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(stdlib.glob("*.py"))[:120]
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(vocab_size=2048, special_tokens=special,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train([str(f) for f in files], trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   bos_token=None)
    fast.chat_template = CHAT
    fast.save_pretrained(out)

    torch.manual_seed(0)
    cfg = Qwen3MoeConfig(vocab_size=2048, hidden_size=256, intermediate_size=512, moe_intermediate_size=256,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                         num_experts=8, num_experts_per_tok=2, max_position_embeddings=512,
                         eos_token_id=tok.token_to_id("<|im_end|>"), bos_token_id=None,
                         tie_word_embeddings=False, torch_dtype="bfloat16")
    model = Qwen3MoeForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(out)
    print(out)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
