"""shoprld: the ShopSimRL campaign daemon.

The code lives in the design card's top-level folders: ``daemon/`` (the runtime) is
installed as :mod:`shoprld.daemon` and ``states/`` (one module per state) as
:mod:`shoprld.states`. This file only makes ``shoprld`` a regular package.
"""

__version__ = "0.1.0"
