import pickle

import pytest

from elmo_core.errors import ConfigError, DataError, ElmoError, WeightsError


def test_messages_name_the_file_line_and_key():
    assert str(DataError("bad token", path="corpus.txt", line=7)) == "corpus.txt:7: bad token"
    assert str(ConfigError("not a number", key="lstm.cell_dim", source="m.yaml")) == (
        "m.yaml, key 'lstm.cell_dim': not a number"
    )
    assert str(WeightsError("shape mismatch", path="w.hdf5")) == "w.hdf5: shape mismatch"
    assert isinstance(DataError("x"), ElmoError)


@pytest.mark.parametrize(
    "error",
    [
        DataError("bad byte", path="a.txt", line=3),
        ConfigError("unknown", key="train.lr", source="c.yaml"),
        WeightsError("missing dataset", path="w.hdf5"),
    ],
)
def test_errors_survive_pickling_with_their_location(error):
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is type(error)
    assert str(copy) == str(error)
    assert copy.__dict__ == error.__dict__
