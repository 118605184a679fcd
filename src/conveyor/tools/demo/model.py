"""The demo's model: softmax regression on pooled pixels, trained by plain SGD.

Tiny on purpose: the demo is about the input pipeline. It runs on numpy, or on torch when
torch is installed; both are deterministic on the CPU, so a run resumed from a checkpoint
ends with exactly the weights of the uninterrupted run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import numpy as np

from conveyor.tools.demo.dataset import IMAGE_SHAPE, NUM_CLASSES

POOL = 4  # 32x32 -> 8x8 per channel
FEATURES = IMAGE_SHAPE[0] * (IMAGE_SHAPE[1] // POOL) * (IMAGE_SHAPE[2] // POOL)
LEARNING_RATE = 0.1


def pooled(images: np.ndarray) -> np.ndarray:
    """(batch, 3, 32, 32) float images -> (batch, FEATURES) averages over POOL x POOL tiles."""
    batch, channels, height, width = images.shape
    tiles = images.reshape(batch, channels, height // POOL, POOL, width // POOL, POOL)
    return tiles.mean(axis=(3, 5), dtype=np.float32).reshape(batch, -1)


class Classifier(Protocol):
    name: str

    def step(self, images: np.ndarray, labels: np.ndarray) -> tuple[float, int]:
        """One SGD step on a batch: ``(mean loss, correct predictions)`` before the update."""
        ...

    def save(self, directory: Path) -> None:
        """Write the weights into ``directory`` (plain SGD keeps no other state)."""
        ...

    def load(self, directory: Path) -> None: ...

    def weights(self) -> np.ndarray: ...


class NumpyClassifier:
    """Softmax regression with hand-written gradients."""

    name = "numpy softmax regression"

    def __init__(self, seed: int):
        rng = np.random.default_rng(seed)
        self._w = (rng.standard_normal((FEATURES, NUM_CLASSES)) * 0.01).astype(np.float32)
        self._b = np.zeros(NUM_CLASSES, dtype=np.float32)

    def step(self, images: np.ndarray, labels: np.ndarray) -> tuple[float, int]:
        x = pooled(images)
        logits = x @ self._w + self._b
        logits -= logits.max(axis=1, keepdims=True)
        probs = np.exp(logits)
        probs /= probs.sum(axis=1, keepdims=True)
        rows = np.arange(len(labels))
        loss = float(-np.log(probs[rows, labels] + 1e-12).mean())
        correct = int((probs.argmax(axis=1) == labels).sum())
        probs[rows, labels] -= 1.0
        probs /= len(labels)
        self._w -= LEARNING_RATE * (x.T @ probs)
        self._b -= LEARNING_RATE * probs.sum(axis=0)
        return loss, correct

    def save(self, directory: Path) -> None:
        np.savez(directory / "model.npz", w=self._w, b=self._b)

    def load(self, directory: Path) -> None:
        with np.load(directory / "model.npz") as saved:
            self._w, self._b = saved["w"].copy(), saved["b"].copy()

    def weights(self) -> np.ndarray:
        return np.concatenate([self._w.ravel(), self._b])


class TorchClassifier:
    """The same model as a ``torch.nn.Linear`` with torch's SGD."""

    name = "torch softmax regression (nn.Linear)"

    def __init__(self, seed: int):
        import torch

        self._torch = torch
        generator = torch.Generator().manual_seed(seed)
        self._model = torch.nn.Linear(FEATURES, NUM_CLASSES)
        with torch.no_grad():
            self._model.weight.copy_(torch.randn(NUM_CLASSES, FEATURES, generator=generator) * 0.01)
            self._model.bias.zero_()
        self._optimizer = torch.optim.SGD(self._model.parameters(), lr=LEARNING_RATE)

    def step(self, images: np.ndarray, labels: np.ndarray) -> tuple[float, int]:
        torch = self._torch
        x = torch.from_numpy(pooled(images))
        y = torch.from_numpy(np.ascontiguousarray(labels))
        logits = self._model(x)
        loss = torch.nn.functional.cross_entropy(logits, y)
        self._optimizer.zero_grad()
        loss.backward()
        self._optimizer.step()
        return loss.item(), int((logits.argmax(dim=1) == y).sum())

    def save(self, directory: Path) -> None:
        self._torch.save(self._model.state_dict(), directory / "model.pt")

    def load(self, directory: Path) -> None:
        self._model.load_state_dict(self._torch.load(directory / "model.pt", weights_only=True))

    def weights(self) -> np.ndarray:
        with self._torch.no_grad():
            return np.concatenate([p.detach().numpy().ravel() for p in self._model.parameters()])


def make_classifier(backend: str, seed: int) -> Any:
    """``"torch"``, ``"numpy"``, or ``"auto"`` (torch when it imports)."""
    if backend == "auto":
        try:
            import torch  # noqa: F401
        except ImportError:
            backend = "numpy"
        else:
            backend = "torch"
    if backend == "torch":
        return TorchClassifier(seed)
    if backend == "numpy":
        return NumpyClassifier(seed)
    raise ValueError(f"backend must be 'auto', 'torch' or 'numpy', got {backend!r}")
