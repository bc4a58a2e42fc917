"""`stageprof gate`: plan a model and compare the plan with a committed baseline, for CI.

command.py is the subcommand (flags, the run, the exit code); verdict.py holds the rules
(pure), baseline.py reads and writes baseline files, recost.py finds today's measurements of
the baseline's stages, reports.py writes JUnit and Markdown, and remote.py / local.py run
today's job on a server or embedded.
"""
