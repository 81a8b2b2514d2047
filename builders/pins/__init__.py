"""pins: the pin-bump bot and the pin guard.

`1bit-build pins status|bump|check` — one program for every upstream in pins.yaml. Pure decisions live in
versions.py and decide.py; effects (git, HTTP, the file edit) are thin modules around them.
"""
