"""io: the project's one way to do each kind of input/output: processes, files, archives, git, HTTP."""
