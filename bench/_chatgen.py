"""Seeded generator of realistic chat traffic for the speed benchmark.

Messages come from templates with filled slots across plans, preferences, work, family, hobbies,
feelings and small talk, in English and some Chinese, plus bare acknowledgements ("ok", "thanks", "👍",
"好的") that narrmem's default triage ignores. Everything comes from one ``random.Random(seed)``, so a
seed always yields the same traffic.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

SLOTS: dict[str, tuple[str, ...]] = {
    "place": (
        "the coffee shop on 5th",
        "the library",
        "Central Park",
        "the gym",
        "the farmers market",
        "the old bookstore",
        "the beach",
        "the museum",
        "the train station",
        "the climbing gym",
        "the community garden",
        "the ramen place downtown",
    ),
    "city": (
        "Kyoto",
        "Lisbon",
        "Chicago",
        "Berlin",
        "Seoul",
        "Vancouver",
        "Mexico City",
        "Edinburgh",
        "Singapore",
        "Austin",
        "Prague",
        "Melbourne",
    ),
    "day": ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"),
    "time": ("7am", "9:30", "noon", "2pm", "half past four", "6pm", "7:45", "8 tonight"),
    "month": ("January", "March", "April", "June", "August", "September", "October", "December"),
    "reason": (
        "a conference",
        "my cousin's wedding",
        "a job interview",
        "a short vacation",
        "a client visit",
    ),
    "activity": (
        "hiking",
        "bouldering",
        "swimming",
        "kayaking",
        "salsa dancing",
        "pottery",
        "camping",
        "cycling",
        "yoga",
        "birdwatching",
    ),
    "event": (
        "dentist appointment",
        "team offsite",
        "book club",
        "parent-teacher meeting",
        "housewarming party",
        "marathon",
        "wedding",
        "job interview",
        "exam",
    ),
    "restaurant": (
        "Luigi's",
        "the Thai place",
        "Blue Door Bistro",
        "Sakura Sushi",
        "the taco truck",
        "Dim Sum Palace",
    ),
    "food": (
        "spicy ramen",
        "mango sticky rice",
        "sourdough bread",
        "dark chocolate",
        "blue cheese",
        "pho",
        "cilantro",
        "margherita pizza",
        "oysters",
        "falafel",
        "durian",
        "pancakes",
    ),
    "taste": ("sweet", "salty", "bitter", "greasy", "bland", "spicy"),
    "band": (
        "Radiohead",
        "Phoebe Bridgers",
        "BTS",
        "Arctic Monkeys",
        "Taylor Swift",
        "Daft Punk",
        "Khruangbin",
    ),
    "show": ("Severance", "The Bear", "Succession", "Slow Horses", "Shogun", "Arcane", "Bluey"),
    "drink": ("green tea", "black coffee", "oat lattes", "matcha", "hot chocolate", "kombucha"),
    "meat": ("bacon", "steak", "chicken wings", "burgers"),
    "project": (
        "Q3 budget",
        "onboarding redesign",
        "data migration",
        "mobile app",
        "customer survey",
        "warehouse audit",
        "grant proposal",
    ),
    "job": ("senior engineer", "team lead", "product manager", "head nurse", "data analyst", "sous chef"),
    "company": ("Acme", "a small startup", "the city hospital", "a design agency", "the university"),
    "tech": ("billing", "CI", "ETL", "search", "payments"),
    "relative": (
        "mom",
        "dad",
        "sister",
        "brother",
        "grandma",
        "grandpa",
        "son",
        "daughter",
        "aunt",
        "cousin",
    ),
    "school": ("kindergarten", "middle school", "college", "piano lessons", "a coding bootcamp", "swim team"),
    "illness": ("cold", "flu", "bad cough", "migraine", "stomach bug"),
    "pet": ("puppy", "kitten", "rabbit", "parrot", "corgi", "tabby cat"),
    "petname": ("Biscuit", "Mochi", "Luna", "Pepper", "Ziggy", "Noodle", "Olive"),
    "instrument": ("guitar", "piano", "violin", "drums", "ukulele", "cello"),
    "book": ("Dune", "Educated", "The Three-Body Problem", "Pachinko", "Project Hail Mary", "Circe"),
    "subject": ("sunset", "lighthouse", "portrait", "bowl of lemons", "mountain lake"),
    "num": ("2", "3", "5", "8", "10", "12", "21"),
    "feeling": (
        "anxious",
        "excited",
        "exhausted",
        "proud",
        "overwhelmed",
        "hopeful",
        "nervous",
        "grateful",
        "frustrated",
        "lonely",
    ),
    "good_thing": (
        "the surgery went well",
        "I passed the exam",
        "we finally closed on the house",
        "she said yes",
    ),
    "weather": ("freezing", "gorgeous", "really humid", "pouring rain", "super windy", "weirdly warm"),
    "sport": ("basketball", "football", "hockey", "baseball", "tennis"),
    "holiday": ("New Year", "Thanksgiving", "Lunar New Year", "Diwali", "Fourth of July"),
    "cn_city": ("北京", "上海", "深圳", "成都", "杭州", "西安", "广州", "重庆"),
    "cn_food": ("火锅", "小笼包", "麻辣烫", "烤鸭", "酸菜鱼", "螺蛳粉", "煎饼果子"),
    "cn_place": ("西湖", "公园", "商场", "海边", "山上", "老街"),
    "cn_relative": ("爸妈", "老婆", "老公", "女儿", "儿子", "奶奶", "表弟"),
    "cn_feeling": ("焦虑", "累", "开心", "崩溃", "迷茫", "烦"),
    "cn_day": ("周一", "周三", "周五", "周六", "周日"),
    "cn_project": ("季度报告", "新版官网", "年终总结", "招聘方案"),
    "cn_hobby": ("吉他", "游泳", "书法", "钢琴", "摄影"),
    "cn_weather": ("下大雨", "特别热", "降温了", "有雾霾"),
}

TEMPLATES: dict[str, tuple[str, ...]] = {
    "plans": (
        "Let's meet at {place} on {day} around {time}.",
        "I'm flying to {city} next {day} for {reason}.",
        "Are we still on for {activity} this {day}?",
        "Can we move the {event} to {day}? Something came up at work.",
        "I booked a table at {restaurant} for {time} on {day}.",
        "Planning a trip to {city} in {month}, any tips on where to stay?",
        "Don't forget the {event} on {day} at {time}!",
        "Thinking about spending {month} in {city} and working remotely.",
    ),
    "preferences": (
        "I really love {food}, especially the one from {restaurant}.",
        "Honestly I can't stand {food}, it's way too {taste} for me.",
        "My favourite band right now is {band}, I have their album on repeat.",
        "I've been obsessed with {show} lately, just finished season {num}.",
        "I prefer {drink} in the morning, coffee makes me jittery.",
        "Trying to go vegetarian this year, so no more {meat} for me.",
        "If I could eat one thing forever it would be {food}.",
    ),
    "work": (
        "My manager wants the {project} report by {day}.",
        "Just got out of a {num}-hour meeting about the {project}, so tired.",
        "Guess what, I got promoted to {job}!",
        "I have an interview at {company} for a {job} position on {day}.",
        "Working from home today, the office AC is broken again.",
        "Our team is shipping the {project} in {month}, fingers crossed.",
        "Spent the whole afternoon debugging the {tech} pipeline.",
    ),
    "family": (
        "My {relative} is visiting us next week, need to clean the guest room.",
        "My {relative} just started {school} and loves it.",
        "Took my {relative} to {place} on {day}, we had a great time.",
        "It's my {relative}'s birthday on {day}, any gift ideas?",
        "My {relative} has had a {illness} since {day}, hope it passes soon.",
        "We adopted a {pet} named {petname}! Best decision ever.",
        "{petname} the {pet} chewed through my headphones again.",
    ),
    "hobbies": (
        "Went {activity} near {city} this weekend, the views were unreal.",
        "I've been practicing {instrument} every evening for {num} weeks now.",
        "Finally finished reading {book}, what a great book.",
        "Signed up for a {activity} class on {day} evenings.",
        "Ran {num} km this morning, new personal best!",
        "I'm painting a {subject} as a gift for my {relative}.",
    ),
    "feelings": (
        "I'm feeling really {feeling} about the {event}.",
        "Today has been rough, I just feel {feeling}.",
        "I'm so happy, {good_thing}!",
        "Kind of {feeling} lately, work has been a lot.",
        "Can't sleep, feeling {feeling} about everything with my {relative}.",
    ),
    "small_talk": (
        "How was your weekend?",
        "The weather in {city} is {weather} today.",
        "Did you catch the {sport} game last night?",
        "What are you up to tonight?",
        "Happy {holiday} to you and your family!",
        "Long time no see, how have you been?",
    ),
    "chinese": (
        "我明天要去{cn_city}出差，{cn_day}回来。",
        "我最喜欢吃{cn_food}了，尤其是{cn_place}附近那家。",
        "周末和{cn_relative}去{cn_place}玩了，挺开心的。",
        "最近工作压力好大，感觉有点{cn_feeling}。",
        "下{cn_day}我们一起去看电影吧？",
        "我{cn_relative}下个月要来{cn_city}看我。",
        "今天跑了{num}公里，累死了。",
        "老板让我{cn_day}之前把{cn_project}做完。",
        "我在学{cn_hobby}，每天练一个小时。",
        "{cn_city}今天{cn_weather}，出门记得带伞。",
    ),
}

# Category weights of content messages (Chinese about one message in eight).
WEIGHTS: dict[str, float] = {
    "plans": 0.17,
    "preferences": 0.13,
    "work": 0.15,
    "family": 0.14,
    "hobbies": 0.12,
    "feelings": 0.1,
    "small_talk": 0.07,
    "chinese": 0.12,
}

# Messages the default triage ignores (bare acknowledgements and reactions).
ACKNOWLEDGEMENTS: tuple[str, ...] = (
    "ok",
    "OK",
    "okay",
    "Ok!",
    "thanks",
    "Thanks!",
    "thx",
    "thank you",
    "👍",
    "lol",
    "haha",
    "got it",
    "sure",
    "cool",
    "nice",
    "yep",
    "sounds good",
    "好的",
    "嗯嗯",
    "收到",
    "谢谢",
    "哈哈哈",
)

QUERIES: tuple[str, ...] = (
    "what food do they like?",
    "when is the trip to {city}?",
    "how is their {relative} doing?",
    "what did they say about the {project}?",
    "which instrument are they learning?",
    "what is the name of their pet?",
    "how have they been feeling lately?",
    "any plans for {day}?",
    "where are they travelling for {reason}?",
    "what happened at work this week?",
    "what are they reading?",
    "does she like {food}?",
    "他最喜欢吃什么？",
    "最近工作怎么样？",
    "什么时候去{cn_city}？",
)

_SLOT = re.compile(r"\{(\w+)\}")


@dataclass(frozen=True)
class Person:
    user_id: str
    name: str


FIRST_NAMES = (
    "Ana",
    "Ben",
    "Chen",
    "Dana",
    "Eli",
    "Fatima",
    "Gus",
    "Hana",
    "Ivan",
    "Jia",
    "Kofi",
    "Lena",
    "Mateo",
    "Nora",
    "Omar",
    "Priya",
    "Quinn",
    "Rosa",
    "Sam",
    "Tao",
    "Uma",
    "Vik",
    "Wei",
    "Yara",
    "Zoe",
)


class ChatGenerator:
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self._categories = list(WEIGHTS)
        self._weights = [WEIGHTS[c] for c in self._categories]

    def fill(self, template: str) -> str:
        return _SLOT.sub(lambda m: self.rng.choice(SLOTS[m.group(1)]), template)

    def content(self) -> str:
        """A message the default triage keeps."""
        [category] = self.rng.choices(self._categories, weights=self._weights)
        return self.fill(self.rng.choice(TEMPLATES[category]))

    def acknowledgement(self) -> str:
        """A message the default triage ignores."""
        return self.rng.choice(ACKNOWLEDGEMENTS)

    def message(self, ack_share: float = 0.2) -> str:
        return self.acknowledgement() if self.rng.random() < ack_share else self.content()

    def query(self) -> str:
        return self.fill(self.rng.choice(QUERIES))

    def unique_contents(self, n: int, max_tries: int = 50) -> list[str]:
        """``n`` distinct content messages (a counter suffix keeps them distinct past the templates')."""
        seen: dict[str, None] = {}
        tries = 0
        while len(seen) < n:
            text = self.content()
            if text in seen:
                tries += 1
                if tries > max_tries * n:
                    text = f"{text} ({len(seen)})"
                else:
                    continue
            seen[text] = None
        return list(seen)

    def people(self, n: int) -> list[Person]:
        return [Person(f"u{i:05d}", f"{self.rng.choice(FIRST_NAMES)} {i}") for i in range(n)]
