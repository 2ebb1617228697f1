#!/usr/bin/env python3
"""Checks the internal links of the built book (docs/book, from `mdbook build docs`): every
relative href and src must name a file of the book, and every #anchor an id in that page.
External links (http, https, mailto) are not fetched. Also checks README.md's and
BENCHMARKS.md's relative links to files of the repository.

    python3 scripts/check_book_links.py [BOOK_DIR]

Exits 1 listing each broken link.
"""
import html.parser
import os
import re
import sys
import urllib.parse

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Page(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.links, self.ids = [], set()

    def handle_starttag(self, tag, attrs):
        for k, v in attrs:
            if k == "id" and v:
                self.ids.add(v)
            if k in ("href", "src") and v and tag in ("a", "img"):
                self.links.append(v)


def parse(path, cache={}):
    if path not in cache:
        p = Page()
        p.feed(open(path, encoding="utf-8").read())
        cache[path] = p
    return cache[path]


def external(url):
    return re.match(r"^[a-z][a-z0-9+.-]*:", url) is not None


def check_book(book):
    broken = []
    for dirpath, _, files in os.walk(book):
        for name in files:
            if not name.endswith(".html") or name in ("print.html", "404.html", "toc.html"):
                continue
            page = os.path.join(dirpath, name)
            for link in parse(page).links:
                if external(link):
                    continue
                url = urllib.parse.urlsplit(link)
                target = os.path.normpath(os.path.join(dirpath, urllib.parse.unquote(url.path))) \
                    if url.path else page
                if not os.path.isfile(target):
                    broken.append(f"{os.path.relpath(page, book)}: {link} (no such file)")
                elif url.fragment and target.endswith(".html") \
                        and url.fragment not in parse(target).ids:
                    broken.append(f"{os.path.relpath(page, book)}: {link} (no such anchor)")
    return broken


def check_markdown(path):
    """Relative links of a markdown file at the repository's root (files only)."""
    broken = []
    text = open(path, encoding="utf-8").read()
    for link in re.findall(r"\]\(([^)\s]+)\)", text):
        if external(link) or link.startswith("#"):
            continue
        target = os.path.join(ROOT, urllib.parse.unquote(link.split("#")[0]))
        if not os.path.exists(target):
            broken.append(f"{os.path.relpath(path, ROOT)}: {link} (no such file)")
    return broken


def main():
    book = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "docs", "book")
    if not os.path.isfile(os.path.join(book, "index.html")):
        sys.exit(f"check_book_links: no book at {book}: run `mdbook build docs` first")
    broken = check_book(book)
    for md in ("README.md", "BENCHMARKS.md"):
        broken += check_markdown(os.path.join(ROOT, md))
    for b in broken:
        print(b)
    print(f"check_book_links: {len(broken)} broken link(s)")
    sys.exit(1 if broken else 0)


if __name__ == "__main__":
    main()
