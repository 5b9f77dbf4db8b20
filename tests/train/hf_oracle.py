"""transformers as the oracle of moetrain's Hugging Face directories
(tests/train/hf_transformers.sh). One process per mode: torch loads once.

  hf_oracle.py make PREFIX TOKENS...
      for each FAMILY (qwen3_moe, mixtral, qwen3) and DTYPE (float32, bfloat16) writes a
      small random model with save_pretrained into PREFIX_FAMILY_DTYPE, and prints
      "FAMILY DTYPE LOSS": its loss on TOKENS (one sequence: inputs TOKENS[:-1],
      targets TOKENS[1:]) computed in fp32 from what it wrote; for the MoE families
      also the float32 model with its experts fused (save_original_format=False) in
      PREFIX_FAMILY_fused, "FAMILY fused LOSS".
  hf_oracle.py check DIR=LOSS ... -- TOKENS...
      loads each DIR with AutoModelForCausalLM (fp32; every tensor used, none missing)
      and checks that its loss on TOKENS is moetrain's LOSS within TOL relative.

Routing must be clear of ties: a token whose k-th and (k+1)-th router
probabilities are closer than MARGIN could be routed otherwise by another
implementation's rounding; the script then fails rather than compare luck.
"""
import sys
import warnings

warnings.filterwarnings("ignore")
import torch  # noqa: E402
import transformers  # noqa: E402

TOL = 1e-5
MARGIN = 1e-4
torch.set_num_threads(1)


def shape(family):
    """The model of tests/train/hf_transformers.sh's namelists."""
    common = dict(vocab_size=257, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
                  rms_norm_eps=1e-5, tie_word_embeddings=False)
    if family == "qwen3_moe":
        return transformers.Qwen3MoeConfig(
            **common, intermediate_size=64, moe_intermediate_size=32, num_experts=4,
            num_experts_per_tok=2, decoder_sparse_step=1, mlp_only_layers=[1],
            norm_topk_prob=True, rope_theta=10000.0), transformers.Qwen3MoeForCausalLM
    if family == "mixtral":
        return transformers.MixtralConfig(
            **common, intermediate_size=32, num_local_experts=4, num_experts_per_tok=2,
            sliding_window=None, rope_theta=10000.0), transformers.MixtralForCausalLM
    return transformers.Qwen3Config(**common, intermediate_size=64, rope_theta=10000.0), \
        transformers.Qwen3ForCausalLM


def loss_of(model, tokens):
    ids = torch.tensor([tokens])
    kw = {}
    if hasattr(model.config, "num_experts_per_tok"):
        kw["output_router_logits"] = True
    with torch.no_grad():
        out = model(input_ids=ids, **kw)
    # the LM loss alone (with router logits, transformers' loss adds the balancing loss)
    loss = torch.nn.functional.cross_entropy(out.logits[0, :-1].float(), ids[0, 1:])
    for logits in (out.router_logits or ()) if kw else ():
        p = torch.softmax(logits.float(), dim=-1).sort(dim=-1, descending=True).values
        k = model.config.num_experts_per_tok
        gap = float((p[:, k - 1] - p[:, k]).min())
        if gap < MARGIN:
            sys.exit("FAIL: a token's routing is %.2e from a tie (< %g): the test's model "
                     "and tokens must route clearly" % (gap, MARGIN))
    return float(loss)


def load(d):
    model, info = transformers.AutoModelForCausalLM.from_pretrained(
        d, dtype=torch.float32, output_loading_info=True)
    bad = {k: v for k, v in info.items() if v and k != "error_msgs"}
    if bad or info.get("error_msgs"):
        sys.exit("FAIL: %s did not load whole: %s" % (d, info))
    return model.eval()


def main():
    if sys.argv[1] == "check":
        at = sys.argv.index("--")
        tokens = [int(t) for t in sys.argv[at + 1:]]
        for arg in sys.argv[2:at]:
            d, want = arg.rsplit("=", 1)
            want = float(want)
            model = load(d)
            got = loss_of(model, tokens)
            rel = abs(got - want) / abs(want)
            print("  %s: transformers %s %.8f, moetrain %.8f, relative %.1e"
                  % (d, type(model).__name__, got, want, rel))
            if not rel <= TOL:
                sys.exit("FAIL: %s: the losses differ by %.2e relative (> %g)" % (d, rel, TOL))
        return
    prefix, tokens = sys.argv[2], [int(t) for t in sys.argv[3:]]
    for family in ("qwen3_moe", "mixtral", "qwen3"):
        for dtype in ("float32", "bfloat16"):
            torch.manual_seed(1)
            cfg, cls = shape(family)
            model = cls(cfg)
            with torch.no_grad():
                for name, p in model.named_parameters():
                    if name.endswith("norm.weight"):
                        p.copy_(1 + 0.1 * torch.randn_like(p))
                    else:
                        p.normal_(0, 0.2 if ".gate." in name else 0.05)
            d = "%s_%s_%s" % (prefix, family, dtype)
            model.to(getattr(torch, dtype)).save_pretrained(d)
            loss = loss_of(load(d), tokens)
            print("%s %s %.9g" % (family, dtype, loss))
            if family != "qwen3" and dtype == "float32":
                # the experts as transformers holds them in memory: fused
                # gate_up_proj [E, 2F, H] and down_proj [E, H, F] per layer
                f = "%s_%s_fused" % (prefix, family)
                model.save_pretrained(f, save_original_format=False)
                print("%s fused %.9g" % (family, loss_of(load(f), tokens)))


main()
