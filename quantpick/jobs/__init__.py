"""Jobs: the whole work of one command, stage by stage (machine -> model -> plan -> fetch -> serve).

One module per job. A job joins the stages (each stage is its own package and knows nothing of
the others' I/O); a command in `cli/` parses its options into the job's inputs, calls one job and
renders what comes back. Only `cli/` imports this package.
"""
