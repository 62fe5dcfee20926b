"""Mamba2Config: the sizes and settings of a Mamba-2 language model, with the official names and defaults
(mamba_ssm's MambaConfig + the Mamba2 mixer's arguments), checked when it is made."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace

import numpy as np

from ...autograd.args import is_integer, is_real_number


@dataclass
class Mamba2Config:
    d_model: int = 2560
    n_layer: int = 64
    vocab_size: int = 50277
    d_state: int = 128
    d_conv: int = 4
    expand: int = 2
    headdim: int = 64
    ngroups: int = 1
    chunk_size: int = 256
    pad_vocab_size_multiple: int = 8
    tie_embeddings: bool = True
    rms_norm_eps: float = 1e-5              # the block norms, norm_f and the gated norm
    dt_min: float = 0.001
    dt_max: float = 0.1
    dt_init_floor: float = 1e-4
    dt_limit: tuple = (0.0, math.inf)       # dt is clamped to this range unless it is (0, inf)
    A_init_range: tuple = (1.0, 16.0)
    bias: bool = False                      # in_proj / out_proj bias
    conv_bias: bool = True

    def __post_init__(self):
        self.check()

    def __setattr__(self, name, value):
        if self.__dict__.get("_model_built") and name != "chunk_size" and self.__dict__.get(name) != value:
            raise AttributeError(f"Mamba2Config.{name}: this is a built model's config, whose weights and layers have "
                                 f"its settings; build a new model from dataclasses.replace(model.config, "
                                 f"{name}=...) (chunk_size, the scan's speed setting, may change)")
        built_chunk = self.__dict__.get("_model_built") and name == "chunk_size"   # 0 was taken, saved, then refused
        if built_chunk and not (is_integer(value) and value >= 1):
            raise ValueError(f"Mamba2Config.chunk_size must be a positive int, got {value!r}")
        super().__setattr__(name, value)

    def for_model(self) -> Mamba2Config:
        """The copy a model keeps: the caller's config may be edited to build another model without changing this
        one (an audit: cfg.dt_limit set after the build changed the built model's logits, ngroups its grouping),
        and the copy's fields are fixed, chunk_size aside."""
        copy = replace(self)
        copy.__dict__["_model_built"] = True                            # past __setattr__'s own refusal
        return copy

    def check(self) -> None:
        """Raise ValueError naming the first field that is wrong, or two that do not fit each other. Run when the
        config is made and again by the model built on it: a field changed since (config.headdim = 5) built a
        model whose step and generate ran and whose forward failed deep inside a reshape."""
        for name in ("d_model", "n_layer", "vocab_size", "d_state", "d_conv", "expand", "headdim", "ngroups",
                     "chunk_size", "pad_vocab_size_multiple"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"Mamba2Config: {name} must be a positive int, got {value!r}")
        for name in ("tie_embeddings", "bias", "conv_bias"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"Mamba2Config: {name} must be a bool (true/false), got {getattr(self, name)!r}")
        for name in ("rms_norm_eps", "dt_min", "dt_max", "dt_init_floor"):
            value = getattr(self, name)
            if not is_real_number(value) or not math.isfinite(value):  # eps = Infinity would make every logit 0
                raise ValueError(f"Mamba2Config: {name} must be a finite number, got {value!r}")
            setattr(self, name, float(value))
        for name in ("dt_limit", "A_init_range"):
            value = getattr(self, name)
            if not isinstance(value, (tuple, list)) or len(value) != 2 or not all(is_real_number(v) for v in value):
                raise ValueError(f"Mamba2Config: {name} must be a pair of numbers (low, high), got {value!r}")
            setattr(self, name, tuple(float(v) for v in value))
        if not all(math.isfinite(v) for v in self.A_init_range) or math.isnan(self.dt_limit[1]):
            raise ValueError(f"Mamba2Config: A_init_range must be finite and dt_limit's high end a number (inf = "
                             f"no limit), got A_init_range={self.A_init_range}, dt_limit={self.dt_limit}")
        if self.d_inner % self.headdim:
            raise ValueError(f"Mamba2Config: d_inner = expand * d_model = {self.d_inner} must be divisible by "
                             f"headdim = {self.headdim}")
        if self.nheads % self.ngroups:
            raise ValueError(f"Mamba2Config: nheads = {self.nheads} must be divisible by ngroups = {self.ngroups}")
        if not self.rms_norm_eps > 0:
            raise ValueError(f"Mamba2Config: rms_norm_eps must be positive, got {self.rms_norm_eps!r}")
        if np.float32(self.rms_norm_eps) == 0:  # a float32 model's norms would make 0 / 0 = NaN of a row of zeros
            raise ValueError(f"Mamba2Config: rms_norm_eps {self.rms_norm_eps!r} is 0 in float32, where a row of zeros "
                             f"(a zeroed embedding row) would normalize to NaN; give at least 1.5e-45")
        if not 0 < self.dt_min <= self.dt_max or not self.dt_init_floor >= 0:  # a floor of 0 floors nothing
            raise ValueError(f"Mamba2Config: need 0 < dt_min <= dt_max and dt_init_floor >= 0, got dt_min="
                             f"{self.dt_min}, dt_max={self.dt_max}, dt_init_floor={self.dt_init_floor}")
        if not 0 <= self.dt_limit[0] < self.dt_limit[1]:
            raise ValueError(f"Mamba2Config: dt_limit must be (low, high) with 0 <= low < high, got {self.dt_limit}")
        if not 0 < self.A_init_range[0] <= self.A_init_range[1]:
            raise ValueError(f"Mamba2Config: A_init_range must be (low, high) with 0 < low <= high, "
                             f"got {self.A_init_range}")

    def param_shapes(self) -> dict:
        """name -> shape of every parameter the model of this config has (mamba_ssm names, creation order),
        computed from the sizes alone: a checkpoint's header is checked against it before any allocation."""
        shapes = {"backbone.embedding.weight": (self.padded_vocab_size, self.d_model)}
        for i in range(self.n_layer):
            p = f"backbone.layers.{i}."
            shapes[p + "norm.weight"] = (self.d_model,)
            shapes[p + "mixer.in_proj.weight"] = (self.d_in_proj, self.d_model)
            if self.bias:
                shapes[p + "mixer.in_proj.bias"] = (self.d_in_proj,)
            shapes[p + "mixer.conv1d.weight"] = (self.conv_dim, 1, self.d_conv)
            if self.conv_bias:
                shapes[p + "mixer.conv1d.bias"] = (self.conv_dim,)
            for name in ("dt_bias", "A_log", "D"):
                shapes[p + "mixer." + name] = (self.nheads,)
            shapes[p + "mixer.norm.weight"] = (self.d_inner,)
            shapes[p + "mixer.out_proj.weight"] = (self.d_model, self.d_inner)
            if self.bias:
                shapes[p + "mixer.out_proj.bias"] = (self.d_model,)
        shapes["backbone.norm_f.weight"] = (self.d_model,)
        if not self.tie_embeddings:
            shapes["lm_head.weight"] = (self.padded_vocab_size, self.d_model)
        return shapes

    # --- derived sizes (docs/mamba2.md, section 3) ---------------------------------------------------------
    @property
    def d_inner(self) -> int:
        return self.expand * self.d_model

    @property
    def nheads(self) -> int:
        return self.d_inner // self.headdim

    @property
    def conv_dim(self) -> int:
        return self.d_inner + 2 * self.ngroups * self.d_state

    @property
    def d_in_proj(self) -> int:
        return 2 * self.d_inner + 2 * self.ngroups * self.d_state + self.nheads

    @property
    def padded_vocab_size(self) -> int:
        m = self.pad_vocab_size_multiple
        return -(-self.vocab_size // m) * m

    # --- plain dicts -----------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        d = asdict(self)
        d["dt_limit"], d["A_init_range"] = list(self.dt_limit), list(self.A_init_range)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Mamba2Config":
        if not isinstance(d, dict):
            raise TypeError(f"Mamba2Config.from_dict: need a dict of its fields, got {type(d).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"Mamba2Config.from_dict: unknown keys {unknown}; known: {sorted(known)}")
        return cls(**d)
