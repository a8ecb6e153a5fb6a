"""Small programs that show how to use interlock; each runs as `python -m interlock.examples.NAME`."""
