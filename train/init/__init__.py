"""How a draft starts: its config and mask token, its vocabulary map, and the optional starts from
an exported draft (`init_from`), from the target's layers, and for the Markov head."""
