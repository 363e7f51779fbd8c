#!/usr/bin/env python3
"""Torch references of the preference losses, for engine/train's golden test.

Writes, under --out (default engine/train/testdata/methods):

  ref/       a tiny random Qwen3ForCausalLM made and saved by transformers (the reference)
  policy/    the same model with every parameter moved by small noise (the policy)
  rm/        Qwen3ForSequenceClassification (num_labels 1, pad_token_id) from the policy's
             weights with transformers' own score head initialisation
  golden.json  the token ids of the pairs and KTO examples, and per case its loss (and, for
             the reward model, the scores)
  grads_<case>.safetensors  d loss / d parameter of the policy (reward model) by HF name

Each loss is written here from TRL's published formulas (DPOTrainer.dpo_loss for sigmoid,
label smoothing and ipo; KTOTrainer.kto_loss; RewardTrainer.compute_loss) and from
docs/methods.md for SMPO, on log-probs that transformers computes. A loss is the mean over
the batch's pairs or examples; sequence log-probs are sums over completion tokens (IPO: means).

Run on the GPU machine (CPU is fine too; it takes seconds), from the repository root:

  python3 scripts/gpu/methods_ref.py --out engine/train/testdata/methods

then commit engine/train/testdata/methods and run `go test ./engine/train -run Golden`.
With --check-rm DIR it also loads a reward model that `halo-shell launch reward` saved in DIR
with AutoModelForSequenceClassification and prints its scores of --check-texts ids.
"""

import argparse
import json
import os

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from transformers import AutoModelForSequenceClassification, Qwen3Config, Qwen3ForCausalLM, Qwen3ForSequenceClassification

VOCAB = 128
PAD = 0


def qwen3_config(theta, **kw):
    """Qwen3Config with RoPE base theta: transformers 5 takes it in rope_parameters, earlier
    versions as rope_theta."""
    cfg = Qwen3Config(rope_parameters={"rope_type": "default", "rope_theta": theta}, **kw)
    rp = getattr(cfg, "rope_parameters", None)
    if not (isinstance(rp, dict) and rp.get("rope_theta") == theta):
        cfg = Qwen3Config(rope_theta=theta, **kw)
    return cfg


def tiny_config():
    return qwen3_config(
        10000.0, vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=64,
        tie_word_embeddings=False, rms_norm_eps=1e-6, pad_token_id=PAD,
    )


def rows(seed):
    """Pairs (prompt, chosen, rejected) and KTO examples (prompt, completion, label) as ids in
    [1, VOCAB): never the pad id 0, so pooling is at each sequence's last token."""
    g = torch.Generator().manual_seed(seed)

    def ids(n):
        return [int(v) for v in torch.randint(1, VOCAB, (n,), generator=g)]

    pairs = [{"prompt": ids(3 + i), "chosen": ids(2 + i % 3), "rejected": ids(4 - i % 2)} for i in range(4)]
    kto = [{"prompt": ids(4), "completion": ids(2 + i % 2), "label": i % 2 == 0} for i in range(4)]
    return pairs, kto


def seq_logps(model, prompt, completion):
    """Sum and count of log p(completion token | everything before it), one sequence."""
    x = torch.tensor([prompt + completion])
    logits = model(input_ids=x).logits[0, :-1].float()
    lp = torch.log_softmax(logits, -1)
    tgt = x[0, 1:]
    tok = lp.gather(-1, tgt[:, None])[:, 0]
    c = tok[len(prompt) - 1:]
    return c.sum(), len(completion)


def pair_logps(model, pairs):
    out = []
    for p in pairs:
        sc, nc = seq_logps(model, p["prompt"], p["chosen"])
        sr, nr = seq_logps(model, p["prompt"], p["rejected"])
        out.append((sc, sr, nc, nr))
    return out


def dpo(policy, ref, pairs, beta, loss_type="sigmoid", eps=0.0):
    """TRL DPOTrainer.dpo_loss; ipo on length-normalised log-probs, as TRL's concatenated_forward."""
    pol = pair_logps(policy, pairs)
    with torch.no_grad():
        rf = pair_logps(ref, pairs)
    losses = []
    for (pc, pr, nc, nr), (rc, rr, _, _) in zip(pol, rf):
        if loss_type == "ipo":
            pc, pr, rc, rr = pc / nc, pr / nr, rc / nc, rr / nr
        logits = (pc - pr) - (rc - rr)
        if loss_type == "sigmoid":
            losses.append(-F.logsigmoid(beta * logits) * (1 - eps) - F.logsigmoid(-beta * logits) * eps)
        elif loss_type == "ipo":
            losses.append((logits - 1 / (2 * beta)) ** 2)
    return torch.stack(losses).mean()


def smpo(policy, pairs, beta, target, ramp, anchor, step, total):
    """docs/methods.md: max(0, gamma_t - beta (a_c - a_r))^2 + anchor * (-a_c), a the mean
    log-prob per completion token, gamma_t = target * min(1, step / (ramp * total))."""
    gamma = target if ramp == 0 else target * min(1.0, step / (ramp * total))
    losses = []
    for pc, pr, nc, nr in pair_logps(policy, pairs):
        ac, ar = pc / nc, pr / nr
        h = torch.clamp(gamma - beta * (ac - ar), min=0)
        losses.append(h * h - anchor * ac)
    return torch.stack(losses).mean()


def kto(policy, ref, examples, beta, wd, wu):
    """TRL KTOTrainer.kto_loss. The KL completions are mismatched as in halo-shell's data: each
    example's prompt with the next example's completion (the last takes the first's); the KL
    estimate is the detached, clamped mean of their log-ratios."""
    n = len(examples)
    kl_terms, ratios = [], []
    for i, e in enumerate(examples):
        nxt = examples[(i + 1) % n]["completion"]
        with torch.no_grad():
            pk, _ = seq_logps(policy, e["prompt"], nxt)
            rk, _ = seq_logps(ref, e["prompt"], nxt)
            rc, _ = seq_logps(ref, e["prompt"], e["completion"])
        kl_terms.append(pk - rk)
        pc, _ = seq_logps(policy, e["prompt"], e["completion"])
        ratios.append(pc - rc)
    kl = torch.stack(kl_terms).mean().clamp(min=0).detach()
    losses = []
    for e, r in zip(examples, ratios):
        if e["label"]:
            losses.append(wd * (1 - torch.sigmoid(beta * (r - kl))))
        else:
            losses.append(wu * (1 - torch.sigmoid(beta * (kl - r))))
    return torch.stack(losses).mean()


def reward(rm, pairs, center):
    """TRL RewardTrainer.compute_loss: -logsigmoid(r_c - r_r), plus the centring term."""
    rcs, rrs = [], []
    for p in pairs:
        rcs.append(rm(input_ids=torch.tensor([p["prompt"] + p["chosen"]])).logits[0, 0])
        rrs.append(rm(input_ids=torch.tensor([p["prompt"] + p["rejected"]])).logits[0, 0])
    rc, rr = torch.stack(rcs), torch.stack(rrs)
    loss = -F.logsigmoid(rc - rr).mean()
    if center:
        loss = loss + center * torch.mean((rc + rr) ** 2)
    return loss, rc, rr


def grads_of(model, loss):
    model.zero_grad(set_to_none=True)
    loss.backward()
    return {n: p.grad.detach().float().contiguous() for n, p in model.named_parameters() if p.grad is not None}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="engine/train/testdata/methods")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--check-rm", default="", help="a reward model directory saved by halo-shell to load and score")
    ap.add_argument("--check-texts", default="", help="token-id lists to score with --check-rm, e.g. '1 2 3;4 5'")
    a = ap.parse_args()
    torch.manual_seed(a.seed)
    os.makedirs(a.out, exist_ok=True)

    if a.check_rm:
        rm = AutoModelForSequenceClassification.from_pretrained(a.check_rm, dtype=torch.float32).eval()
        for t in a.check_texts.split(";"):
            ids = [int(v) for v in t.split()]
            print(json.dumps({"ids": ids, "score": rm(input_ids=torch.tensor([ids])).logits[0].tolist()}))
        return

    cfg = tiny_config()
    ref = Qwen3ForCausalLM(cfg).eval()
    policy = Qwen3ForCausalLM(cfg).eval()
    policy.load_state_dict(ref.state_dict())
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.02 * torch.randn_like(p))
    ref.save_pretrained(os.path.join(a.out, "ref"))
    policy.save_pretrained(os.path.join(a.out, "policy"))

    pairs, examples = rows(a.seed)
    golden = {"pairs": pairs, "kto": examples, "cases": {}}
    cases = {
        "dpo_sigmoid": (dict(method="dpo", beta=0.1, loss_type="sigmoid"), lambda: dpo(policy, ref, pairs, 0.1)),
        "dpo_label_smoothing": (dict(method="dpo", beta=0.5, loss_type="sigmoid", label_smoothing=0.2), lambda: dpo(policy, ref, pairs, 0.5, eps=0.2)),
        "dpo_ipo": (dict(method="dpo", beta=0.1, loss_type="ipo"), lambda: dpo(policy, ref, pairs, 0.1, loss_type="ipo")),
        "smpo": (dict(method="smpo", beta=1.2, target_margin=0.35, margin_ramp_ratio=1.0, anchor_weight=1.0, step=3, total=10),
                 lambda: smpo(policy, pairs, 1.2, 0.35, 1.0, 1.0, 3, 10)),
        "smpo_hinge": (dict(method="smpo", beta=1.2, target_margin=5.0, margin_ramp_ratio=0.0, anchor_weight=0.5, step=1, total=10),
                       lambda: smpo(policy, pairs, 1.2, 5.0, 0.0, 0.5, 1, 10)),
        "kto": (dict(method="kto", beta=0.1, desirable_weight=1.0, undesirable_weight=1.5), lambda: kto(policy, ref, examples, 0.1, 1.0, 1.5)),
    }
    for name, (params, fn) in cases.items():
        loss = fn()
        g = grads_of(policy, loss)
        save_file(g, os.path.join(a.out, f"grads_{name}.safetensors"))
        golden["cases"][name] = dict(params, loss=float(loss))
        print(f"{name}: loss {float(loss):.6f}")

    # The reward model: the policy's decoder, transformers' score head initialisation.
    rcfg = tiny_config()
    rcfg.num_labels = 1
    rcfg.architectures = ["Qwen3ForSequenceClassification"]
    rm = Qwen3ForSequenceClassification(rcfg).eval()
    missing = rm.model.load_state_dict(policy.model.state_dict())
    assert not missing.missing_keys and not missing.unexpected_keys, missing
    rm.save_pretrained(os.path.join(a.out, "rm"))
    for name, center in (("reward", 0.0), ("reward_center", 0.05)):
        loss, rc, rr = reward(rm, pairs, center)
        g = grads_of(rm, loss)
        save_file(g, os.path.join(a.out, f"grads_{name}.safetensors"))
        golden["cases"][name] = dict(method="reward", center_rewards_coefficient=center, loss=float(loss),
                                     scores_chosen=rc.tolist(), scores_rejected=rr.tolist())
        print(f"{name}: loss {float(loss):.6f}")
    golden["versions"] = {"torch": torch.__version__, "transformers": __import__("transformers").__version__}
    with open(os.path.join(a.out, "golden.json"), "w") as f:
        json.dump(golden, f, indent=1)
    print("wrote", a.out)


if __name__ == "__main__":
    main()
