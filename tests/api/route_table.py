"""The table of every /v1 route and the test that shows its refusals (tests/api/test_security.py checks that the
app's routes and this table are the same set, so a new route needs a line here and a test of its refusals)."""

from __future__ import annotations

# Every /v1 route that takes a session id: requests on tenant A's (completed, one-chunk) render and what A
# gets. Tenant B sends the same requests and must get what an unknown id gets; A must get something else.
SESSION_ROUTES: dict[tuple[str, str], list[tuple[str, int]]] = {
    ("GET", "/v1/renders/{session_id}"): [("/v1/renders/{id}", 200)],
    ("GET", "/v1/sessions/{session_id}"): [("/v1/sessions/{id}", 200)],
    ("GET", "/v1/renders/{session_id}/video.mp4"): [("/v1/renders/{id}/video.mp4", 200)],
    ("GET", "/v1/renders/{session_id}/{name}"): [
        ("/v1/renders/{id}/stream.m3u8", 200),
        ("/v1/renders/{id}/init.mp4", 200),
        ("/v1/renders/{id}/seg-N00000.m4s", 200),
    ],
    ("GET", "/v1/renders/{session_id}/events"): [("/v1/renders/{id}/events", 200)],  # ends: the render has
    ("POST", "/v1/renders/{session_id}/cancel"): [("/v1/renders/{id}/cancel", 409)],  # it is already completed
    ("POST", "/v1/renders/{session_id}/resume"): [("/v1/renders/{id}/resume", 409)],  # only failed or cancelled
    ("POST", "/v1/sessions/{session_id}/ticket"): [("/v1/sessions/{id}/ticket", 409)],  # a render takes no audio
    # A reaches its render, which has no s3 sink (a 404 that names the sink, not the session).
    ("GET", "/v1/renders/{session_id}/sinks/{sink}/stream.m3u8"): [("/v1/renders/{id}/sinks/s3/stream.m3u8", 404)],
}
# The routes without a session id, and the audio socket: each has its own test below, or in the module named
# before a colon (the feature's own tests, on the same stack).
AVATARS = "tests.api.test_avatars:test_avatars_belong_to_their_tenant_and_bad_creates_keep_nothing"
OTHER_ROUTES = {
    ("GET", "/v1/renders"): "test_lists_show_only_the_callers_sessions",
    ("POST", "/v1/renders"): "test_sessions_belong_to_the_tenant_that_starts_them",
    ("POST", "/v1/sessions"): "test_sessions_belong_to_the_tenant_that_starts_them",
    ("WS", "/v1/sessions/{session_id}/audio"): "test_a_live_session_and_its_audio_socket_are_its_tenants_alone",
    ("POST", "/v1/webhooks"): "test_webhook_endpoints_and_deliveries_are_their_tenants_alone",
    ("GET", "/v1/webhooks"): "test_webhook_endpoints_and_deliveries_are_their_tenants_alone",
    ("DELETE", "/v1/webhooks/{endpoint_id}"): "test_webhook_endpoints_and_deliveries_are_their_tenants_alone",
    ("GET", "/v1/webhooks/deliveries"): "test_webhook_endpoints_and_deliveries_are_their_tenants_alone",
    ("POST", "/v1/assets"): "test_assets_are_their_tenants_alone",
    ("DELETE", "/v1/assets/{asset_id}"): "test_assets_are_their_tenants_alone",
    ("POST", "/v1/avatars"): AVATARS,
    ("GET", "/v1/avatars"): AVATARS,
    ("GET", "/v1/avatars/{avatar_id}"): AVATARS,
    ("DELETE", "/v1/avatars/{avatar_id}"): AVATARS,
    # The owner's delete (which would end the shared render above) is tests/api/test_delete.py's.
    ("DELETE", "/v1/renders/{session_id}"): "test_another_tenants_delete_is_404_exactly_like_an_unknown_id",
    ("DELETE", "/v1/sessions/{session_id}"): "test_another_tenants_delete_is_404_exactly_like_an_unknown_id",
}
# WebRTC's routes take no key: a viewer holds the session's signed playback link, a microphone its audio ticket (or a
# key), and a connection's DELETE its unguessable resource id from `Location`. Each names the test of its refusals.
WHEP_LINKS = "tests.test_webrtc:test_offers_without_a_valid_link_are_refused"
WHEP_SFU = "tests.test_webrtc_sfu:test_sfu_viewers_answer_with_patch_and_bad_answers_are_refused"
WHIP_TICKETS = "tests.test_webrtc_whip:test_whip_without_a_ticket_or_opus_is_refused"
KEYLESS_ROUTES = {
    ("POST", "/v1/live/{session_id}/whep"): WHEP_LINKS,
    ("DELETE", "/v1/live/{session_id}/whep/{resource}"): WHEP_LINKS,
    ("GET", "/v1/live/{session_id}/player"): WHEP_LINKS,
    ("PATCH", "/v1/live/{session_id}/whep/{resource}"): WHEP_SFU,
    ("POST", "/v1/live/{session_id}/whep/{resource}/alive"): WHEP_SFU,
    (
        "GET",
        "/v1/live/{session_id}/ice-servers",
    ): "tests.test_webrtc_turn_browser:test_the_ice_servers_need_the_sessions_playback_link",
    ("POST", "/v1/live/{session_id}/whip"): WHIP_TICKETS,
    ("DELETE", "/v1/live/{session_id}/whip/{resource}"): WHIP_TICKETS,
}
