"""``python -m tvm_pesto.cli ...``: the ``tvm-pesto`` command (:func:`tvm_pesto.cli.main.main`), for
an environment whose scripts folder is not on ``PATH``."""
from tvm_pesto.cli.main import main

if __name__ == "__main__":
    main()
