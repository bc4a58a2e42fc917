"""The `stageprof` command line: the composition root, the one package that wires the
store, the workers, the server and the client SDK together (`cli.main`)."""
