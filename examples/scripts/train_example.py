#!/usr/bin/env python3
"""Train cardproof's example models: ~4M-parameter decoders on Tiny Shakespeare.

`--arch qwen3` (the default) is a dense Qwen3 decoder; `--arch qwen3_5` is a ~1.4M-parameter
hybrid Qwen3.5 text model of the seed's family (three Gated DeltaNet layers then one gated
full-attention layer, with partial RoPE and zero-centred norms) at half the width.

The text (examples/data/tinyshakespeare.txt) is Shakespeare's plays as collected in
karpathy/char-rnn (data/tinyshakespeare/input.txt); the plays are in the public domain. The last
10% of the text is held out as a validation split (its loss is printed). The eval text
(examples/data/eval.txt) is 32,000 characters of the *training* split, cut at line ends: a model
this small cannot generalise from one megabyte of text (held-out perplexity stays near 60), while
on text it has seen its next-token distributions are as peaked as a large model's on ordinary
text, which is what KLD measurements of quantization need. It is a test fixture, not a benchmark.

Needs torch, transformers and tokenizers (runs in a few minutes on one GPU; CPU works, slowly).
Writes OUT/{config.json, generation_config.json, model.safetensors (bf16), tokenizer.json,
tokenizer_config.json} and examples/data/eval.txt.

    python3 examples/scripts/train_example.py --out examples/models/shakespeare-bf16
    python3 examples/scripts/train_example.py --arch qwen3_5 --steps 800 \
        --out examples/models/shakespeare-hybrid-bf16 --keep-eval
"""

import argparse
import json
import math
import os
import time

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    PreTrainedTokenizerFast,
    Qwen3_5ForCausalLM,
    Qwen3_5TextConfig,
    Qwen3Config,
    Qwen3ForCausalLM,
)

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "data")
VOCAB = 2048
EVAL_CHARS = 32_000


def split_text(text):
    cut = int(len(text) * 0.9)
    cut = text.index("\n", cut) + 1
    train, val = text[:cut], text[cut:]
    start = train.index("\n\n", len(train) // 2) + 2
    end = train.index("\n", start + EVAL_CHARS) + 1
    return train, train[start:end], val


def train_tokenizer(train_text):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([train_text], trainer=trainer)
    return tok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--arch", choices=["qwen3", "qwen3_5"], default="qwen3")
    ap.add_argument(
        "--keep-eval",
        action="store_true",
        help="do not rewrite examples/data/eval.txt (it is the same cut of the text either way)",
    )
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    dev = "cuda" if torch.cuda.is_available() else "cpu"

    text = open(os.path.join(DATA, "tinyshakespeare.txt"), encoding="utf-8").read()
    train_text, eval_text, val_text = split_text(text)
    if not args.keep_eval:
        with open(os.path.join(DATA, "eval.txt"), "w", encoding="utf-8") as f:
            f.write(eval_text)

    tok = train_tokenizer(train_text)
    eos = tok.token_to_id("<|endoftext|>")
    train_ids = torch.tensor(tok.encode(train_text).ids, dtype=torch.long)
    val_ids = torch.tensor(tok.encode(val_text).ids, dtype=torch.long)
    print(f"tokens: train {len(train_ids)}, val {len(val_ids)}", flush=True)

    if args.arch == "qwen3":
        config = Qwen3Config(
            vocab_size=VOCAB,
            hidden_size=256,
            intermediate_size=768,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=64,
            max_position_embeddings=1024,
            rope_theta=10000.0,
            rms_norm_eps=1e-6,
            tie_word_embeddings=False,
            bos_token_id=eos,
            eos_token_id=eos,
            attention_bias=False,
        )
        model = Qwen3ForCausalLM(config).to(dev)
    else:
        # The seed's layout at toy scale: layers 0-2 Gated DeltaNet, layer 3 full attention
        # (full_attention_interval 4), 2 key heads serving 4 value heads in the GDN layers. Half
        # the dense example's width, so that the repository stays small enough to travel.
        config = Qwen3_5TextConfig(
            vocab_size=VOCAB,
            hidden_size=128,
            intermediate_size=384,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=32,
            linear_conv_kernel_dim=4,
            linear_key_head_dim=32,
            linear_value_head_dim=32,
            linear_num_key_heads=2,
            linear_num_value_heads=4,
            max_position_embeddings=1024,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
            rms_norm_eps=1e-6,
            tie_word_embeddings=False,
            bos_token_id=eos,
            eos_token_id=eos,
        )
        model = Qwen3_5ForCausalLM(config).to(dev)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"parameters: {n_params}", flush=True)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr,
        betas=(0.9, 0.95),
    )
    gen = torch.Generator().manual_seed(args.seed)

    def batch(ids):
        starts = torch.randint(0, len(ids) - args.seq - 1, (args.batch,), generator=gen)
        x = torch.stack([ids[s : s + args.seq] for s in starts])
        return x.to(dev)

    eval_ids = torch.tensor(tok.encode(eval_text).ids, dtype=torch.long)

    @torch.no_grad()
    def val_loss(ids=val_ids):
        model.eval()
        losses = []
        for s in range(0, len(ids) - args.seq, args.seq):
            x = ids[s : s + args.seq].unsqueeze(0).to(dev)
            with torch.autocast(dev, dtype=torch.bfloat16):
                losses.append(model(x, labels=x).loss.float().item())
        model.train()
        return sum(losses) / len(losses)

    t0 = time.time()
    warmup = 100
    for step in range(args.steps):
        lr = args.lr * min(1.0, (step + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * step / args.steps))
        for g in opt.param_groups:
            g["lr"] = lr
        x = batch(train_ids)
        with torch.autocast(dev, dtype=torch.bfloat16):
            loss = model(x, labels=x).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 100 == 99 or step == args.steps - 1:
            v = val_loss()
            print(f"step {step + 1}: train {loss.item():.3f} val {v:.3f} ({time.time() - t0:.0f} s)", flush=True)
    val, ev = val_loss(), val_loss(eval_ids)
    print(f"final: val loss {val:.4f} (ppl {math.exp(val):.2f}), eval-text loss {ev:.4f} (ppl {math.exp(ev):.2f})", flush=True)

    os.makedirs(args.out, exist_ok=True)
    model.to(torch.bfloat16).save_pretrained(args.out, safe_serialization=True)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|endoftext|>")
    fast.save_pretrained(args.out)
    with open(os.path.join(args.out, "training.json"), "w") as f:
        json.dump(
            {
                "text": "examples/data/tinyshakespeare.txt (public domain; via karpathy/char-rnn)",
                "steps": args.steps,
                "batch": args.batch,
                "seq": args.seq,
                "lr": args.lr,
                "seed": args.seed,
                "arch": args.arch,
                "val_loss": val,
                "eval_text_loss": ev,
                "parameters": n_params,
                "torch": torch.__version__,
            },
            f,
            indent=2,
        )


if __name__ == "__main__":
    main()
