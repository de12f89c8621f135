"""Which search distribution a model samples from: isotropic (sigma alone), a sigma per entry (scales, held by
the modules that multiply them into their noise: :mod:`.scales`) or a full covariance (its factor, held by the
model: :mod:`.covariance`). A model holds at most one of the last two; this is the one place that says so."""

from __future__ import annotations

ISOTROPIC, SCALES, COVARIANCE = "isotropic", "scales", "covariance"

# the refusal to set one distribution beside the other, by the one the model holds
BESIDE = {COVARIANCE: "the model has a covariance (set_covariance); scales cannot be set beside it: "
                      "set_covariance(None) first",
          SCALES: "the model has a sigma per parameter (set_scales); a covariance replaces it: set_scales(None) first"}


class ModelDistribution:
    """Mixin of :class:`nesgpu.PerturbedModel`: the distribution it samples from, read from what it holds. Uses
    the model's ``scales()``, ``covariance_factor()`` and ``subspace``."""

    @property
    def distribution(self) -> str:
        """:data:`ISOTROPIC`, :data:`SCALES` (:meth:`set_scales` gave one) or :data:`COVARIANCE`
        (:meth:`set_covariance` gave one)."""
        if self.covariance_factor() is not None:
            return COVARIANCE
        return SCALES if self.scales() else ISOTROPIC

    def check_distribution(self, wanted: str) -> None:
        """A ValueError if the model holds a distribution other than ``wanted`` (``SCALES`` or ``COVARIANCE``)
        that setting ``wanted`` would sit beside, or perturbs a subspace per step, whose zero noise ``wanted``
        would adapt from."""
        held = self.distribution
        if held not in (ISOTROPIC, wanted):
            raise ValueError(BESIDE[held])
        if self.subspace < 1:
            what = "covariance" if wanted == COVARIANCE else "sigma per parameter"
            raise ValueError(f"the model perturbs a subspace per step (set_subspace({self.subspace})), whose zero "
                             f"noise a {what} would adapt from; set_subspace(1) first")
