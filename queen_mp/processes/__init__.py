"""Process entry points: ``queen-mp serve`` (cli, supervisor), gunicorn's arbiter and worker
class for the front, and the operator CLI ``queenctl``. Nothing outside this package imports it."""
