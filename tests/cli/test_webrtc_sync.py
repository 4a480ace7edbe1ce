"""The content-based A/V offset's parts (cli/benches/webrtc_sync.py): onsets after quiet spells, the page's grid of
dark cells computed the same way from frames, the offset net of the model's own lag, and the calibration's pairing."""

from __future__ import annotations

import numpy as np

from cli.benches.webrtc_calibrate import read_offsets
from cli.benches.webrtc_sync import answered, av_offsets, grid_cells, heard_onsets_s, onsets


def test_an_onset_is_a_rise_after_a_quiet_spell_in_the_unit_of_the_times() -> None:
    times = np.arange(0, 10_000, 10.0)  # ms
    level = np.zeros_like(times)
    for start in (2000, 2300, 6000):  # 2300 follows 2000 within the quiet spell: the same burst
        level[(times >= start) & (times < start + 200)] = 1.0
    assert onsets(times, level, threshold=0.5, quiet=1000) == [2000.0, 6000.0]
    assert onsets(times, level, threshold=0.5, quiet=50) == [2000.0, 2300.0, 6000.0]
    assert onsets(times, level, threshold=2.0, quiet=1000) == []


def test_grid_cells_are_the_share_of_dark_pixels_per_cell() -> None:
    frames = np.full((2, 64, 64, 3), 255, np.uint8)
    frames[1, :2, :2] = 0  # the top-left 2×2 cell of a 32×32 grid is all dark in the second frame
    frames[1, 2:4, 2] = 0  # half of the cell beside it on the diagonal
    cells = grid_cells(frames)
    assert cells.shape == (2, 32 * 32) and cells[0].sum() == 0
    assert cells[1, 0] == 1.0 and cells[1, 33] == 0.5 and cells[1].sum() == 1.5


def test_the_offset_is_the_page_lag_less_the_models_own_and_misdetections_are_left_out() -> None:
    seen, heard, own = [1040.0, 5100.0, 9900.0], [1000.0, 5000.0, 9000.0], [-0.04, -0.04, -0.04]
    assert av_offsets(seen, heard, own) == [80.0, 140.0]  # the third: 900 ms apart, a missed detection


def test_an_onset_is_answered_by_the_first_opening_before_the_next_onset_or_missed() -> None:
    # The second onset fell in a stall (no opening before the third was sent): missed, not paired with the third's.
    onsets_ms = [1000.0, 4000.0, 7000.0, 10_000.0]
    openings_ms = [1500.0, 1700.0, 7480.0, 10_520.0, 12_000.0]
    assert answered(onsets_ms, openings_ms) == [500.0, 480.0, 520.0]
    assert answered(onsets_ms, []) == []
    assert answered([1000.0], [900.0]) == []  # an opening before the onset answers nothing


def test_the_speech_sent_is_read_the_way_the_page_hears_it_not_from_where_a_burst_starts() -> None:
    # A burst whose level ramps up over 50 ms from sample 16000: its onset is where a window's level passes a quarter
    # of the loudest (about 12.5 ms in), not the burst's first sample.
    rate = 16_000
    pcm = np.zeros(3 * rate)
    ramp = np.minimum(np.arange(rate) / (0.05 * rate), 1.0)
    pcm[rate : 2 * rate] = 10_000 * ramp * np.sign(np.sin(2 * np.pi * 200 * np.arange(rate) / rate))
    (onset,) = heard_onsets_s(pcm, rate, gap_s=1.0)
    assert 1.0 + 0.010 <= onset <= 1.0 + 0.016


def test_the_calibration_pairs_each_flash_with_the_tone_nearest_it_and_drops_the_unpaired() -> None:
    """cli/benches/webrtc_calibrate.py: flashes every 1.5 s seen 40 ms before their tones are heard read −40 each; a
    flash with no tone within the event's length is not paired."""
    frames = [[t, [1.0 if (t - 1000) % 1500 < 300 else 0.0] * 4] for t in np.arange(0.0, 7000.0, 10.0)]
    heard = [[t, 0.5 if (t - 1040) % 1500 < 300 and t < 4000 else 0.01] for t in np.arange(0.0, 7000.0, 2.0)]
    offsets = read_offsets(frames, heard)
    assert len(offsets) == 2 and all(abs(value + 40) < 1 for value in offsets), offsets
    assert read_offsets(frames, []) == []
