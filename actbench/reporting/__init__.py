"""Read-only views of finished runs: derived tables, figures, the Markdown report, the paper's numbers."""
