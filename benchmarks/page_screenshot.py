"""The README's picture of the page: `bertkit serve` on a model folder (default: the run that
`bertkit pretrain` leaves), fill-mask and the attention view in headless Chromium (Debian's
chromium and chromium-driver), saved as docs/serve-page.png.

    .venv/bin/python benchmarks/page_screenshot.py [--model runs/pretrain-...] [--text "... [MASK] ..."]
"""
from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import time
import urllib.request


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--text", default="its urban gardens [MASK] separated by adobe walls.")
    ap.add_argument("--out", default="docs/serve-page.png")
    args = ap.parse_args()
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "bertkit", "serve", "--model", args.model, "--port", str(port)])
    try:
        for _ in range(600):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        options = Options()
        options.binary_location = "/usr/bin/chromium"
        for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--disable-background-networking", "--disable-component-update", "--disable-sync",
                     "--no-first-run", "--window-size=1150,1500"):
            options.add_argument(flag)
        driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
        try:
            driver.get(f"http://127.0.0.1:{port}/")
            WebDriverWait(driver, 30).until(lambda d: d.execute_script(
                "return document.getElementById('info').textContent.startsWith('model')"))
            box = driver.find_element(By.ID, "text")
            box.clear()
            box.send_keys(args.text)
            driver.find_element(By.ID, "run-fill-mask").click()
            WebDriverWait(driver, 30).until(lambda d: d.find_elements(By.CSS_SELECTOR, "#fill-mask-result .bar"))
            driver.find_element(By.ID, "run-attention").click()
            WebDriverWait(driver, 30).until(lambda d: d.find_elements(By.CSS_SELECTOR, "#attention-svg"))
            Select(driver.find_element(By.ID, "layer")).select_by_value("1")
            time.sleep(0.5)
            driver.save_screenshot(args.out)
        finally:
            driver.quit()
    finally:
        server.terminate()
        server.wait()
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
