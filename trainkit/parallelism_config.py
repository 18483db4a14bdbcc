"""``trainkit.parallelism_config.ParallelismConfig``: where Accelerate's scripts import it from
(``accelerate.parallelism_config``); also ``trainkit.ParallelismConfig`` and ``trainkit.utils.ParallelismConfig``.

The degrees, their validation and Accelerate's read-only views live in :mod:`trainkit.config.parallelism` (plain
data, no torch). This class adds the one method of Accelerate's class that builds a torch object,
:meth:`ParallelismConfig.build_device_mesh` (and :meth:`~ParallelismConfig.get_device_mesh`, which keeps it); the
Accelerator builds its own mesh (``accelerator.torch_device_mesh``, also set as the config's ``device_mesh``) and
accepts either class.
"""

from __future__ import annotations

from typing import Any, cast

from trainkit.config.parallelism import ParallelismConfig as _ParallelismData

__all__ = ["ParallelismConfig"]


class ParallelismConfig(_ParallelismData):
    __doc__ = _ParallelismData.__doc__

    def build_device_mesh(self, device_type: str) -> Any:
        """A torch ``DeviceMesh`` over the enabled dimensions (mesh order ``dp_replicate, dp_shard, cp, sp, tp``),
        with Accelerate's flattened views ``dp``, ``dp_shard_cp`` and ``dp_cp`` (each made when it has a
        dimension); None when no dimension is above 1. Needs the process group (``init_process_group``).

        Args:
            device_type: ``"cpu"``, ``"cuda"``, ... (torch's device type for ``init_device_mesh``).
        """
        from torch.distributed import device_mesh  # looked up at call time: tests may stand in for it

        mesh = self._get_mesh()
        if not mesh:
            return None
        names, shape = mesh
        built = device_mesh.init_device_mesh(device_type, shape, mesh_dim_names=names)
        for dimensions, flat_name in ((self.dp_dim_names, "dp"), (self.dp_shard_cp_dim_names, "dp_shard_cp"),
                                      (self.dp_cp_dim_names, "dp_cp")):
            if dimensions:
                # the list the dim-name properties return, as Accelerate indexes (torch takes any sequence of
                # names at run time; a script's stand-in mesh records what it was given)
                built[cast(Any, dimensions)]._flatten(flat_name)
        return built

    def get_device_mesh(self, device_type: str | None = None) -> Any:
        """The config's ``device_mesh`` (set by the Accelerator, or built here once with ``device_type``).

        Raises:
            ValueError: no mesh yet and no ``device_type``, or a mesh of another device type exists.
        """
        if self.device_mesh is None:
            if device_type is None:
                raise ValueError("ParallelismConfig.get_device_mesh(): no mesh has been built yet; pass the "
                                 "device_type to build one (e.g. 'cuda' or 'cpu').")
            self.device_mesh = self.build_device_mesh(device_type)
        elif device_type is not None and self.device_mesh.device_type != device_type:
            raise ValueError(f"ParallelismConfig.get_device_mesh({device_type!r}): the mesh was built for "
                             f"{self.device_mesh.device_type!r}.")
        return self.device_mesh
