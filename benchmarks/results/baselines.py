"""The supervised rows' baselines, fitted on ddprl's own split: scikit-learn models on the tabular
tasks, a ridge regression on pair-distance counts for graph_energy."""

from __future__ import annotations

import functools


def sklearn_baselines(dataset: str, seed: int) -> dict[str, float]:
    """Test accuracy of scikit-learn models on ddprl's split (split_seed=0, standardised with the
    training statistics), fitted on train + val."""
    import torch
    from sklearn.linear_model import LogisticRegression
    from sklearn.neural_network import MLPClassifier

    from ddprl.supervised.tasks import _tabular_splits

    splits = _tabular_splits(dataset, 0)
    x_fit = torch.cat([splits["train"][0], splits["val"][0]]).numpy()
    y_fit = torch.cat([splits["train"][1], splits["val"][1]]).numpy()
    x_test, y_test = (t.numpy() for t in splits["test"])
    models = {
        "scikit-learn LogisticRegression": LogisticRegression(max_iter=5000),
        "scikit-learn MLPClassifier (128, 128), early stopping": MLPClassifier(
            (128, 128), early_stopping=True, max_iter=500, random_state=seed
        ),
    }
    return {name: float(model.fit(x_fit, y_fit).score(x_test, y_test)) for name, model in models.items()}


GRAPH_BINS = 100


@functools.cache  # the same for every seed: generated from the split seed, fitted deterministically
def graph_baselines() -> dict[str, float]:
    """Test MSE (of the standardised energy) on ddprl's graph_energy split (its default options):
    the training mean, and a linear model on what the energy is a function of, the number of
    particle pairs at each distance (edges counted in GRAPH_BINS distance bins up to the cutoff).
    The linear model is told the answer's form (a sum of pair terms), the GNN is not: a bound
    rather than a peer."""
    import numpy as np
    import torch
    from sklearn.linear_model import RidgeCV

    from ddprl.supervised.graph import OPTIONS, graph_splits

    splits = graph_splits(*(OPTIONS[k] for k in ("num_graphs", "min_nodes", "max_nodes", "radius", "split_seed")))
    edges = np.linspace(0.0, OPTIONS["radius"], GRAPH_BINS + 1)

    def features(graphs) -> tuple[np.ndarray, np.ndarray]:
        counts = []
        for g in graphs:
            src, dst = g.edge_index
            d = torch.linalg.vector_norm(g.pos[dst] - g.pos[src], dim=1)[src < dst]  # each pair once
            counts.append(np.histogram(d.numpy(), bins=edges)[0])
        return np.array(counts, dtype=np.float64), np.array([g.y.item() for g in graphs])

    x_fit, y_fit = features(splits["train"] + splits["val"])
    x_test, y_test = features(splits["test"])
    predicted = RidgeCV(alphas=np.logspace(-6, 2, 9)).fit(x_fit, y_fit).predict(x_test)
    return {
        "the training mean": float(np.mean((y_fit.mean() - y_test) ** 2)),
        f"scikit-learn RidgeCV on pair counts in {GRAPH_BINS} distance bins": float(np.mean((predicted - y_test) ** 2)),
    }
