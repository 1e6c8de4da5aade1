import pytest

from tokenfair.workloads.workload import WorkloadError, read_trace


def test_csv_and_jsonl_round_trip(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("request_id,arrival_s,tenant,prompt_tokens,output_tokens,class,deadline_s\n"
                 "b,1.5,acme,10,5,batch,\n"
                 "a,0.5,acme,20,3,,4\n")
    wl = read_trace(p)
    assert [r.request_id for r in wl.rows] == ["a", "b"]
    assert wl.rows[0].deadline_s == 4 and wl.rows[1].klass == "batch"
    j = tmp_path / "t.jsonl"
    j.write_text('{"request_id": "x", "arrival_s": 0, "tenant": "t", "prompt_tokens": 1, "output_tokens": 2}\n')
    assert read_trace(j).rows[0].output_tokens == 2


@pytest.mark.parametrize("row,field", [
    ("a,0,acme,x,5", "prompt_tokens"),
    ("a,-1,acme,3,5", "arrival_s"),
    ("a,0,acme,3,0", "output_tokens"),
    ("a,0,,3,5", "tenant"),
    ("a,nan,acme,3,5", "arrival_s"),
    ("a,0,acme,99999999999999999999,5", "prompt_tokens"),      # overflowed the int64 records
    ("a,0,acme,3,10000000000001", "output_tokens"),
])
def test_bad_row_names_file_line_field(tmp_path, row, field):
    p = tmp_path / "bad.csv"
    p.write_text("request_id,arrival_s,tenant,prompt_tokens,output_tokens\nok,0,t,1,1\n" + row + "\n")
    with pytest.raises(WorkloadError) as err:
        read_trace(p)
    msg = str(err.value)
    assert f"{p}:3" in msg and field in msg


def test_missing_header_and_duplicate_ids(tmp_path):
    p = tmp_path / "noheader.csv"
    p.write_text("a,0,t,1,1\n")
    with pytest.raises(WorkloadError, match="header"):
        read_trace(p)
    d = tmp_path / "dup.jsonl"
    line = '{"request_id": "x", "arrival_s": 0, "tenant": "t", "prompt_tokens": 1, "output_tokens": 2}\n'
    d.write_text(line * 2)
    with pytest.raises(WorkloadError, match="appears twice"):
        read_trace(d)


def test_bad_json_line(tmp_path):
    p = tmp_path / "t.jsonl"
    p.write_text('{"request_id": "x"\n')
    with pytest.raises(WorkloadError, match=r"t.jsonl:1: not valid JSON"):
        read_trace(p)


@pytest.mark.parametrize("hashes", ['"123"', "5", '["x"]', "[1.5]", "[true]", '{"a": 1}'])
def test_prefix_hashes_must_be_a_list_of_integers(tmp_path, hashes):
    """A string was read character by character, ``1.5`` truncated, ``5`` crashed the run."""
    p = tmp_path / "t.jsonl"
    p.write_text('{"request_id": "x", "arrival_s": 0, "tenant": "t", "prompt_tokens": 64, "output_tokens": 2, '
                 f'"hash_ids": {hashes}}}\n')
    with pytest.raises(WorkloadError, match=r"t.jsonl:1: field 'prefix_hashes/hash_ids': expected"):
        read_trace(p)
    p.write_text('{"request_id": "x", "arrival_s": 0, "tenant": "t", "prompt_tokens": 64, "output_tokens": 2, '
                 '"prefix_hashes": [7, 8]}\n')
    assert read_trace(p).rows[0].prefix_hashes == (7, 8)
