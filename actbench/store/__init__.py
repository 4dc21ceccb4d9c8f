"""Run directories on disk: rows.jsonl (the truth), derived tables, locks and claims."""
