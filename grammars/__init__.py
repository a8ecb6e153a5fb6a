"""Grammar backends (xgrammar, llguidance) behind one matcher protocol, and the compile cache."""
