#!/usr/bin/env python3
"""Train cardproof's tool-calling example: a ~1.5M-parameter Qwen3 decoder that calls the stage
manager's three tools in the example chat template's format (Qwen3.5's XML calls), so that its
quantizations can be seen to break tool calls, or not.

The conversations are synthetic and made here, seeded: a system prompt declaring the tools, then
three requests; each request is answered with one call whose arguments are copied from the
request (a quoted phrase, a play, an act and a scene, a room, a day, a number of hours), the
tool's result, and a short answer. Phrases are cut from Tiny Shakespeare
(examples/data/tinyshakespeare.txt, public domain). The tokenizer is the Shakespeare examples'
(examples/models/shakespeare-bf16/tokenizer.json), the template examples/data/chat_template.jinja,
rendered by transformers' apply_chat_template as cardproof renders it.

Writes OUT/{config.json, generation_config.json, model.safetensors (bf16), tokenizer.json,
tokenizer_config.json, training.json} and, with --eval, the held-out conversations the example
study measures (different seed, the same generator).

    python3 examples/scripts/train_tools.py --out examples/models/stagehand-bf16 \
        --eval examples/data/tool-calls.jsonl
"""

import argparse
import json
import math
import os
import random
import time

import torch
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..")
DATA = os.path.join(ROOT, "data")
TOKENIZER = os.path.join(ROOT, "models", "shakespeare-bf16")

PLAYS = {
    "romeo_and_juliet": "Romeo and Juliet",
    "richard_iii": "King Richard III",
    "taming_of_the_shrew": "The Taming of the Shrew",
}
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday"]
ROOMS = ["A", "B", "C"]

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "search_text",
            "description": "Find a phrase in the plays.",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string"}},
                "required": ["query"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "read_scene",
            "description": "Read one scene of a play.",
            "parameters": {
                "type": "object",
                "properties": {
                    "play": {"type": "string", "enum": list(PLAYS)},
                    "act": {"type": "integer", "minimum": 1, "maximum": 5},
                    "scene": {"type": "integer", "minimum": 1, "maximum": 5},
                },
                "required": ["play", "act", "scene"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "book_room",
            "description": "Book a rehearsal room.",
            "parameters": {
                "type": "object",
                "properties": {
                    "room": {"type": "string", "enum": ROOMS},
                    "day": {"type": "string", "enum": DAYS},
                    "hours": {"type": "integer", "minimum": 1, "maximum": 4},
                },
                "required": ["room", "day", "hours"],
            },
        },
    },
]

SYSTEM = "You are the stage manager's assistant. Use the tools; copy names and words exactly."


def phrases(rng):
    """Short phrases of plain words from Tiny Shakespeare's lines."""
    text = open(os.path.join(DATA, "tinyshakespeare.txt"), encoding="utf-8").read()
    out = []
    for line in text.splitlines():
        words = [w.strip(",.;:!?'\"-").lower() for w in line.split()]
        words = [w for w in words if w.isalpha()]
        if len(words) >= 4:
            n = rng.randint(2, 4)
            start = rng.randint(0, len(words) - n)
            out.append(" ".join(words[start : start + n]))
    return out


def request(rng, pool):
    """One user request and the call that answers it, and the tool's result."""
    kind = rng.randrange(3)
    if kind == 0:
        phrase = rng.choice(pool)
        ask = rng.choice(
            [
                f'Find the line "{phrase}" for the actors.',
                f'Where is "{phrase}"? Search for it.',
                f'Search the plays for "{phrase}".',
            ]
        )
        call = {"name": "search_text", "arguments": {"query": phrase}}
        result = json.dumps({"found": rng.choice(list(PLAYS)), "act": rng.randint(1, 5)})
    elif kind == 1:
        play = rng.choice(list(PLAYS))
        act, scene = rng.randint(1, 5), rng.randint(1, 5)
        ask = rng.choice(
            [
                f"Read act {act} scene {scene} of {PLAYS[play]}.",
                f"Give me {PLAYS[play]}, act {act}, scene {scene}.",
            ]
        )
        call = {"name": "read_scene", "arguments": {"play": play, "act": act, "scene": scene}}
        result = json.dumps({"lines": rng.randint(40, 300)})
    else:
        room, day, hours = rng.choice(ROOMS), rng.choice(DAYS), rng.randint(1, 4)
        ask = rng.choice(
            [
                f"Book room {room} on {day} for {hours} hours.",
                f"We need room {room} for {hours} hours on {day}.",
            ]
        )
        call = {"name": "book_room", "arguments": {"room": room, "day": day, "hours": hours}}
        result = json.dumps({"booked": True})
    return ask, call, result


def conversation(rng, pool, turns=3):
    messages = [{"role": "system", "content": SYSTEM}]
    for i in range(turns):
        ask, call, result = request(rng, pool)
        messages.append({"role": "user", "content": ask})
        messages.append(
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"type": "function", "id": f"call_{i}", "function": call}],
            }
        )
        messages.append({"role": "tool", "tool_call_id": f"call_{i}", "content": result})
        messages.append({"role": "assistant", "content": rng.choice(["Done.", "Here it is.", "All set."])})
    return {"messages": messages, "tools": TOOLS}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--eval", help="write the held-out conversations here (JSON lines)")
    ap.add_argument("--conversations", type=int, default=3000)
    # Many requests a conversation: the tools' declarations (most of a render's tokens) are
    # then a small part of what is learnt.
    ap.add_argument("--requests", type=int, default=10)
    ap.add_argument("--eval-conversations", type=int, default=6)
    ap.add_argument("--eval-requests", type=int, default=6)
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--batch", type=int, default=16)
    # A whole conversation's length: the tools' declarations alone are ~1,000 tokens of this
    # small tokenizer, so a shorter window never trains the positions a call is made at.
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    rng = random.Random(args.seed)
    pool = phrases(rng)

    tok = PreTrainedTokenizerFast.from_pretrained(TOKENIZER)
    template = open(os.path.join(DATA, "chat_template.jinja"), encoding="utf-8").read()
    render = lambda c: tok.apply_chat_template(
        c["messages"], tools=c["tools"], chat_template=template, tokenize=False
    )
    ids = []
    for _ in range(args.conversations):
        ids.extend(
            tok(render(conversation(rng, pool, args.requests)), add_special_tokens=False)["input_ids"]
        )
    ids = torch.tensor(ids, dtype=torch.long)
    print(f"tokens: {len(ids)}", flush=True)
    if args.eval:
        held = random.Random(args.seed + 1)
        with open(args.eval, "w", encoding="utf-8") as f:
            for _ in range(args.eval_conversations):
                c = conversation(held, pool, args.eval_requests)
                f.write(json.dumps(c, ensure_ascii=False) + "\n")

    eos = tok.convert_tokens_to_ids("<|endoftext|>")
    config = Qwen3Config(
        vocab_size=len(tok),
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=2048,
        rope_theta=10000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        bos_token_id=eos,
        eos_token_id=eos,
        attention_bias=False,
    )
    model = Qwen3ForCausalLM(config).to(dev)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"parameters: {n_params}", flush=True)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    gen = torch.Generator().manual_seed(args.seed)
    t0 = time.time()
    for step in range(args.steps):
        lr = args.lr * min(1.0, (step + 1) / 100) * 0.5 * (1 + math.cos(math.pi * step / args.steps))
        for g in opt.param_groups:
            g["lr"] = lr
        starts = torch.randint(0, len(ids) - args.seq - 1, (args.batch,), generator=gen)
        x = torch.stack([ids[s : s + args.seq] for s in starts]).to(dev)
        with torch.autocast(dev, dtype=torch.bfloat16):
            loss = model(x, labels=x).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 250 == 249 or step == args.steps - 1:
            print(f"step {step + 1}: loss {loss.item():.4f} ({time.time() - t0:.0f} s)", flush=True)

    # Greedy calls on held-out requests, as a check that the model learnt to call.
    model.eval()
    check = random.Random(args.seed + 2)
    right = 0
    trials = 50
    for _ in range(trials):
        c = conversation(check, pool, turns=1)
        prompt = tok.apply_chat_template(
            c["messages"][:2], tools=c["tools"], chat_template=template, tokenize=False,
            add_generation_prompt=True,
        )
        x = tok(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"].to(dev)
        with torch.no_grad():
            y = model.generate(x, max_new_tokens=96, do_sample=False, eos_token_id=eos)
        text = tok.decode(y[0, x.shape[1] :])
        call = c["messages"][2]["tool_calls"][0]["function"]
        want = [f"<function={call['name']}>"] + [
            f"<parameter={k}>\n{v}\n</parameter>" for k, v in call["arguments"].items()
        ]
        right += all(w in text for w in want)
    print(f"greedy calls right: {right}/{trials}", flush=True)

    os.makedirs(args.out, exist_ok=True)
    model.to(torch.bfloat16).save_pretrained(args.out, safe_serialization=True)
    tok.save_pretrained(args.out)
    with open(os.path.join(args.out, "training.json"), "w") as f:
        json.dump(
            {
                "data": "synthetic tool conversations (examples/scripts/train_tools.py), phrases from examples/data/tinyshakespeare.txt",
                "conversations": args.conversations,
                "requests": args.requests,
                "steps": args.steps,
                "batch": args.batch,
                "seq": args.seq,
                "lr": args.lr,
                "seed": args.seed,
                "final_loss": loss.item(),
                "greedy_calls_right": f"{right}/{trials}",
                "parameters": n_params,
                "torch": torch.__version__,
            },
            f,
            indent=2,
        )


if __name__ == "__main__":
    main()
