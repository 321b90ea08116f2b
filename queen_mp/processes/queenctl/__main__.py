"""``python -m queen_mp.processes.queenctl``: the same CLI as the ``queenctl`` entry point."""

from queen_mp.processes.queenctl import main

if __name__ == "__main__":
    main(prog_name="queenctl")
