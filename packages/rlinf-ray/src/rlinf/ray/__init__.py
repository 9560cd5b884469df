"""Ray launcher plugin for rlinf: worker groups as Ray actors."""
