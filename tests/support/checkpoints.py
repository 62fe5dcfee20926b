"""Writers of checkpoint layouts (transformers' folder), shared by the tests of loading checkpoints
(tests/models/test_pretrained.py, test_config_files.py)."""
import json
import math

from tinygrad_ssm.io.safetensors import save_file


def write_transformers_dir(directory, model, infinity_style="token", dtype=None):
    """The model as Hugging Face transformers stores a Mamba-2 checkpoint."""
    c = model.config
    config = {
        "model_type": "mamba2", "architectures": ["Mamba2ForCausalLM"],
        "hidden_size": c.d_model, "num_hidden_layers": c.n_layer, "vocab_size": c.padded_vocab_size,
        "state_size": c.d_state, "head_dim": c.headdim, "num_heads": c.nheads, "n_groups": c.ngroups,
        "expand": c.expand, "conv_kernel": c.d_conv, "chunk_size": c.chunk_size, "use_bias": c.bias,
        "use_conv_bias": c.conv_bias, "layer_norm_epsilon": c.rms_norm_eps, "rms_norm": True,
        "hidden_act": "silu", "residual_in_fp32": True, "time_step_min": c.dt_min, "time_step_max": c.dt_max,
        "time_step_floor": c.dt_init_floor, "tie_word_embeddings": c.tie_embeddings, "pad_token_id": 0,
        "time_step_limit": [c.dt_limit[0], c.dt_limit[1] if math.isfinite(c.dt_limit[1]) or infinity_style == "token"
                            else {"__float__": "Infinity"}],
    }
    text = json.dumps(config, indent=2)                                 # writes the bare token Infinity
    if math.isinf(c.dt_limit[1]):
        assert ("Infinity" in text) and (infinity_style == "token") == ('"__float__"' not in text)
    (directory / "config.json").write_text(text)
    weights = {}
    for name, t in model.varmap.named_vars():
        key = "backbone.embeddings.weight" if name == "backbone.embedding.weight" else name
        weights[key] = t.data.astype(dtype or t.dtype)
    save_file(directory / "model.safetensors", weights)
    return config
