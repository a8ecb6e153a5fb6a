"""Small programs that show how to use interlock; each runs as `python -m interlock.examples.NAME`.
user.json is the schema of the README's `interlock generate --schema` example."""
