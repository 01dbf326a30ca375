"""The results page's harness (docs/results.md): ``run.py`` beside this file is its command."""
