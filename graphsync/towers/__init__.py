"""Which name scopes are towers (the second stage, after match/ found the candidates).

    scopes     the known conventions (tower_0/, tower_0/v0/, tower0/, clone_0/, replica_1/) and towers=
    names      what names alone say: scope families differing only in an integer index
    structure  towers found by the graph's structure, whatever their scopes are called
"""
