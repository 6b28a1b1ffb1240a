"""What an installed engine's own source says about GPU architectures (`moelab audit`).

Module map: source.py (find and parse the installed packages), profile.py (what is engine
specific, as data from engines/sources/), values.py + evaluate.py (three-valued evaluation for
one arch), refs.py (where the source tests a flag's value), walk.py (a function's refusals and
calls with their path conditions), gates.py (which refusals gate which backend value),
declared.py (arch lists, support predicates, capability floors), matrix.py (cells, drift), run.py
(the whole audit, cached per engine version), knowledge.py (curated matrix, source and launches
side by side for `moelab check`), render.py (text output).
"""
