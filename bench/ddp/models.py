"""The comparison's models and the data they learn, all generated here (no downloads).

* ``MarkovText``: token sequences from a fixed random Markov chain (order 1, ``succ`` successors
  per token with peaked random probabilities). Its entropy rate is the lowest loss any model can
  reach, so a loss curve says how far training got. ``entropy_rate()`` computes it.
* ``LM``: a GPT-2-shaped decoder (pre-LayerNorm blocks, causal self-attention, GELU MLP, tied
  input/output embedding). Preset ``gpt2`` is GPT-2 small's shape (124 M parameters with a
  50257-token vocabulary); ``gpt2-chain`` is the same model on a chain over 256 of its tokens.
* ``ResNet``: ResNet-50's layout written here (bottleneck blocks 3-4-6-3, BatchNorm), so the
  bench runs where torchvision is absent; ``width=64`` is ResNet-50 itself (25.6 M parameters
  with 1000 classes), smaller widths for CPU. ``ClassImages``: synthetic images, one fixed
  random template per class plus noise, so the loss falls as the model learns the templates.

Every generator takes an explicit seed: the same data on every run, per rank.
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

# name -> (vocab, d_model, layers, heads, seq, batch)
LM_PRESETS = {
    "tiny": (256, 64, 2, 4, 32, 8),
    # The GPU time-to-accuracy LM: small's width and depth on tiny's chain (256 tokens), which
    # it learns to 0.35 nats above the floor in about a hundred steps at Adam 2e-3, where
    # small's 1024-token chain takes several hundred.
    "mid": (256, 256, 4, 4, 128, 16),
    "small": (1024, 256, 4, 4, 128, 8),
    "gpt2": (50257, 768, 12, 12, 512, 8),
    # GPT-2 small itself (124 M parameters, 50257-token embedding, 500 MB of gradients) on a
    # chain over its first 256 tokens (LM_CHAIN_TOKENS), which it learns in a time-to-accuracy
    # run's steps; 128 tokens of context, 8 sequences a rank.
    "gpt2-chain": (50257, 768, 12, 12, 128, 8),
}
# Presets whose Markov chain covers only the first N tokens of the model's vocabulary.
LM_CHAIN_TOKENS = {"gpt2-chain": 256}


def lm_chain(preset):
    """The Markov chain an LM preset trains on."""
    return MarkovText(LM_CHAIN_TOKENS.get(preset, LM_PRESETS[preset][0]))
# name -> (width, image, batch, classes)
RESNET_PRESETS = {
    "tiny": (8, 32, 8, 10),
    "small": (16, 64, 8, 10),
    # The GPU time-to-accuracy ResNet: small's network on 100 classes (small reaches 100% on 10
    # in 30 steps of 32 images: too few evaluations to tell contestants apart).
    "mid": (16, 64, 32, 100),
    "resnet50": (64, 224, 32, 1000),
}


class MarkovText:
    """A fixed random order-1 Markov chain over ``vocab`` tokens (seeded)."""

    def __init__(self, vocab, succ=8, sharpness=2.0, seed=1234):
        g = torch.Generator().manual_seed(seed)
        self.vocab = vocab
        self.succ = torch.randint(0, vocab, (vocab, succ), generator=g)
        self.probs = torch.softmax(torch.randn(vocab, succ, generator=g) * sharpness, dim=1)

    def stationary(self, iters=300):
        pi = torch.full((self.vocab,), 1.0 / self.vocab, dtype=torch.float64)
        for _ in range(iters):
            pi = 0.5 * pi + 0.5 * self.step(pi)  # lazy chain: converges even for periodic chains
        return pi

    def step(self, dist):
        """The distribution of the next token when the current one is distributed as ``dist``
        (float64 [vocab]): one step of the transition matrix."""
        nxt = torch.zeros_like(dist)
        nxt.index_add_(0, self.succ.reshape(-1), (dist[:, None] * self.probs.double()).reshape(-1))
        return nxt

    def state_entropy(self):
        """Nats of the next token given the current one, per token (float64 [vocab]); repeated
        successors of a row add up (entropy over distinct next tokens), exactly."""
        s, order = self.succ.sort(dim=1)
        q = self.probs.double().gather(1, order)
        for j in range(1, s.shape[1]):  # fold each run of equal successors into its last slot
            same = s[:, j] == s[:, j - 1]
            q[:, j] = torch.where(same, q[:, j] + q[:, j - 1], q[:, j])
            q[:, j - 1] = torch.where(same, torch.zeros_like(q[:, j - 1]), q[:, j - 1])
        return -(q * q.clamp_min(1e-300).log()).sum(1)

    def entropy_rate(self):
        """Nats per token of the chain at its stationary distribution."""
        return float((self.stationary() * self.state_entropy()).sum())

    def loss_floor(self, length, burn_in=16):
        """The lowest expected loss (nats per token) of any model on ``sample(n, length + 1)``'s
        (input, next-token) pairs: the chain is order 1, so the best prediction of a token given
        everything before it is its row of the transition matrix, and the expected loss at
        position t is the state entropy averaged over the distribution of token t. That is the
        uniform start pushed through ``burn_in + t`` steps of the transition matrix, computed
        exactly here (no sampling)."""
        h = self.state_entropy()
        dist = torch.full((self.vocab,), 1.0 / self.vocab, dtype=torch.float64)
        for _ in range(burn_in):
            dist = self.step(dist)
        total = 0.0
        for _ in range(length):
            total += float((dist * h).sum())
            dist = self.step(dist)
        return total / length

    def sample(self, n, length, seed):
        """``n`` sequences of ``length`` tokens (int64 [n, length]), seeded."""
        g = torch.Generator().manual_seed(seed)
        out = torch.empty(n, length, dtype=torch.long)
        cur = torch.randint(0, self.vocab, (n,), generator=g)
        for _ in range(16):  # burn in towards the stationary distribution (loss_floor's burn_in)
            k = torch.multinomial(self.probs[cur], 1, generator=g).squeeze(1)
            cur = self.succ[cur, k]
        for t in range(length):
            out[:, t] = cur
            k = torch.multinomial(self.probs[cur], 1, generator=g).squeeze(1)
            cur = self.succ[cur, k]
        return out


class Attention(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        if hasattr(F, "scaled_dot_product_attention"):
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
            mask = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
            y = att.masked_fill(mask, float("-inf")).softmax(-1) @ v
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = Attention(d, heads)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.out = nn.Linear(4 * d, d)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class LM(nn.Module):
    def __init__(self, vocab, d, layers, heads, seq):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.zeros(seq, d))
        self.blocks = nn.ModuleList([Block(d, heads) for _ in range(layers)])
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.tok.weight  # tied, as GPT-2
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)
        nn.init.normal_(self.pos, std=0.01)

    def forward(self, idx):
        x = self.tok(idx) + self.pos[: idx.shape[1]]
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln(x))


class Bottleneck(nn.Module):
    def __init__(self, cin, width, stride):
        super().__init__()
        cout = width * 4
        self.c1 = nn.Conv2d(cin, width, 1, bias=False)
        self.b1 = nn.BatchNorm2d(width)
        self.c2 = nn.Conv2d(width, width, 3, stride, 1, bias=False)
        self.b2 = nn.BatchNorm2d(width)
        self.c3 = nn.Conv2d(width, cout, 1, bias=False)
        self.b3 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                      nn.BatchNorm2d(cout))

    def forward(self, x):
        y = F.relu(self.b1(self.c1(x)))
        y = F.relu(self.b2(self.c2(y)))
        y = self.b3(self.c3(y))
        return F.relu(y + (x if self.down is None else self.down(x)))


class ResNet(nn.Module):
    """ResNet-50's layout (3, 4, 6, 3 bottlenecks); width 64 is ResNet-50."""

    def __init__(self, width=64, classes=1000, blocks=(3, 4, 6, 3)):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 7, 2, 3, bias=False), nn.BatchNorm2d(width),
                                  nn.ReLU(), nn.MaxPool2d(3, 2, 1))
        layers, cin = [], width
        for i, n in enumerate(blocks):
            w = width * (2 ** i)
            for j in range(n):
                layers.append(Bottleneck(cin, w, 2 if (j == 0 and i > 0) else 1))
                cin = w * 4
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        x = self.layers(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class ClassImages:
    """Synthetic labelled images: a fixed random template per class plus Gaussian noise."""

    def __init__(self, classes, image, seed=4321, noise=1.0):
        g = torch.Generator().manual_seed(seed)
        self.classes = classes
        self.image = image
        self.noise = noise
        # Low-frequency templates (upsampled 8x8 patterns): learnable by a convnet.
        base = torch.randn(classes, 3, 8, 8, generator=g)
        self.templates = F.interpolate(base, size=(image, image), mode="bilinear",
                                       align_corners=False)

    def sample(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        y = torch.randint(0, self.classes, (n,), generator=g)
        x = self.templates[y] + self.noise * torch.randn(n, 3, self.image, self.image, generator=g)
        return x, y


def build(model, preset, seed=0):
    """(module, data source, description) for ``model`` in {transformer, resnet50}."""
    torch.manual_seed(seed)
    if model == "transformer":
        vocab, d, layers, heads, seq, _ = LM_PRESETS[preset]
        return LM(vocab, d, layers, heads, seq)
    width, _, _, classes = RESNET_PRESETS[preset]
    return ResNet(width, classes)
