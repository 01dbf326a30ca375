"""The supervised rows' baselines, fitted on ddprl's own split (train + val) and scored on its test split."""

from __future__ import annotations

import functools


def sklearn_baselines(dataset: str, seed: int) -> dict[str, float]:
    """Test accuracy of scikit-learn models fitted on ddprl's train + val (split_seed=0, standardised)."""
    import torch
    from sklearn.linear_model import LogisticRegression
    from sklearn.neural_network import MLPClassifier

    from ddprl.supervised.tasks import _tabular_splits

    splits = _tabular_splits(dataset, 0)
    x_fit, y_fit = (torch.cat([splits["train"][i], splits["val"][i]]).numpy() for i in (0, 1))
    x_test, y_test = (t.numpy() for t in splits["test"])
    mlp = MLPClassifier((128, 128), early_stopping=True, max_iter=500, random_state=seed)
    models = {"scikit-learn LogisticRegression": LogisticRegression(max_iter=5000)}
    models["scikit-learn MLPClassifier (128, 128), early stopping"] = mlp
    return {name: float(model.fit(x_fit, y_fit).score(x_test, y_test)) for name, model in models.items()}


GRAPH_BINS = 100


@functools.cache  # the same for every seed: generated from the split seed, fitted deterministically
def graph_baselines() -> dict[str, float]:
    """Test MSE of the standardised energy on ddprl's graph_energy split: the training mean, and a ridge
    regression on what the energy is a function of, the count of particle pairs in each of GRAPH_BINS
    distance bins (told the answer's form, a sum of pair terms, as the GNN is not: a bound, not a peer)."""
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
    ridge = f"scikit-learn RidgeCV on pair counts in {GRAPH_BINS} distance bins"
    mean, ridged = float(np.mean((y_fit.mean() - y_test) ** 2)), float(np.mean((predicted - y_test) ** 2))
    return {"the training mean": mean, ridge: ridged}
