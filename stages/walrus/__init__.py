"""Walrus (patch jittering for continuum-dynamics foundation models), in miniature."""
from stages.common.sources import Source

SOURCES = [Source(
    real="The Well: shear_flow, turbulent_radiative_layer_2D (HDF5, read by the_well's WellDataset)",
    params_key="papers.walrus.prepare.source",
    loader="stages.walrus.well:load_well_group",
    fixture_test="tests/walrus/test_real_source.py::test_well_fixture_through_the_well",
    note="full profile: source {kind: file, dataset: <The Well base path>}, well_datasets, well_fields, "
         "well_resolution; the fixture includes a non-periodic (wall/open) dataset",
)]
