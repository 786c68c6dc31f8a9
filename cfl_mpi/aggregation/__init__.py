"""How a cluster's updates become its model: the rules, the screening, and a sum whose bits do not
depend on the order of its terms."""
