"""Reference vectors for tests/it: all-MiniLM-L6-v2 recomputed in numpy, without torch.

The BERT forward pass (embeddings, 6 post-norm encoder layers with exact-erf GELU), mean
pooling over the attention mask and L2 normalisation follow sentence-transformers'
Transformer -> Pooling(mean) -> Normalize modules, in float64. Tokenized by the model's own
tokenizer.json through the Python `tokenizers` package (no padding, truncated at 256 tokens).

    python3 -m venv /tmp/ref && /tmp/ref/bin/pip install numpy safetensors tokenizers
    /tmp/ref/bin/python reference.py MODEL_DIR > reference.json
"""
import json
import math
import sys

import numpy as np
from safetensors.numpy import load_file
from tokenizers import Tokenizer

SENTENCES = [
    "what time is it in Tokyo",
    "remember that Alice is an engineer",
    "Read the contents of a file from the filesystem.",
    "The quick brown fox jumps over the lazy dog.",
    "Ünïcödé and emoji 🦀 survive tokenization",
    "a",
    " ".join(["search the catalog for the tools a request needs"] * 40),
]

def erf(x):
    return np.vectorize(math.erf)(x)

def layer_norm(x, w, b, eps=1e-12):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b

def embed(t, tok, text):
    enc = tok.encode(text)
    ids = np.array(enc.ids)
    n = len(ids)
    p = "embeddings."
    x = t[p + "word_embeddings.weight"][ids] + t[p + "position_embeddings.weight"][:n] + t[p + "token_type_embeddings.weight"][0]
    x = layer_norm(x, t[p + "LayerNorm.weight"], t[p + "LayerNorm.bias"])
    heads, d = 12, 32
    for i in range(6):
        p = f"encoder.layer.{i}."
        lin = lambda h, name: h @ t[p + name + ".weight"].T + t[p + name + ".bias"]
        q = lin(x, "attention.self.query").reshape(n, heads, d).transpose(1, 0, 2)
        k = lin(x, "attention.self.key").reshape(n, heads, d).transpose(1, 0, 2)
        v = lin(x, "attention.self.value").reshape(n, heads, d).transpose(1, 0, 2)
        s = q @ k.transpose(0, 2, 1) / math.sqrt(d)
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        a = (s @ v).transpose(1, 0, 2).reshape(n, heads * d)
        x = layer_norm(lin(a, "attention.output.dense") + x, t[p + "attention.output.LayerNorm.weight"], t[p + "attention.output.LayerNorm.bias"])
        h = lin(x, "intermediate.dense")
        h = 0.5 * h * (1 + erf(h / math.sqrt(2)))
        x = layer_norm(lin(h, "output.dense") + x, t[p + "output.LayerNorm.weight"], t[p + "output.LayerNorm.bias"])
    m = x.mean(0)
    return m / max(np.linalg.norm(m), 1e-12)

def main():
    d = sys.argv[1]
    t = {k.removeprefix("bert."): v.astype(np.float64) for k, v in load_file(d + "/model.safetensors").items()}
    tok = Tokenizer.from_file(d + "/tokenizer.json")
    tok.no_padding()
    tok.enable_truncation(256)
    out = [{"text": s, "tokens": len(tok.encode(s).ids), "vector": [round(float(x), 7) for x in embed(t, tok, s)]} for s in SENTENCES]
    json.dump(out, sys.stdout, ensure_ascii=False, indent=None)
    print()

main()
